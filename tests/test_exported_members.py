"""The public API is one curated front door."""

import ai_lease

# The public surface, pinned: adding or removing a name is a decision, made here on purpose.
PUBLIC = [
    "Acquired",
    "AdaptiveBudgets",
    "AiLeaseError",
    "ChatRequest",
    "Client",
    "Completion",
    "ConfigError",
    "CorruptRecord",
    "Delta",
    "EmptyAnswer",
    "EmptyEventStream",
    "Event",
    "FailureKind",
    "Fence",
    "FencingRejected",
    "Finished",
    "FirstTokenTimeout",
    "Following",
    "Health",
    "InputError",
    "Job",
    "JobCancelled",
    "JobConflict",
    "JobDeadlineExceeded",
    "JobFailed",
    "JobLease",
    "JobLogger",
    "JobSpecError",
    "JobState",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "LeaseTimings",
    "Metrics",
    "OutcomeUnknown",
    "Pipeline",
    "PostgresStore",
    "Progress",
    "PromptLibrary",
    "Provider",
    "ProviderError",
    "RedisStore",
    "Refusal",
    "Removal",
    "Renewal",
    "RetryPolicy",
    "RunConfig",
    "RunHooks",
    "Runner",
    "SQLiteStore",
    "Settings",
    "SlotHold",
    "SlotLost",
    "SlotWaitTimeout",
    "Stage",
    "StageBudget",
    "StageContext",
    "StageDeadlineExceeded",
    "StageTimeout",
    "StallPolicy",
    "Stalled",
    "Status",
    "StoreDataLost",
    "StoreError",
    "StoreUnavailable",
    "StreamGuard",
    "StreamIdleTimeout",
    "StreamInterrupted",
    "StreamLimitExceeded",
    "StreamLimits",
    "StreamTimeouts",
    "StreamTotalTimeout",
    "SyncClient",
    "Usage",
    "Worker",
    "__version__",
    "available_providers",
    "configure_logging",
    "connect",
    "create_provider",
    "fan_out",
    "load_settings",
    "mask_url",
    "open_store",
    "run_sync",
    "serve_metrics",
]


def test_all_is_the_pinned_sorted_surface() -> None:
    """__all__ is sorted and is exactly the pinned list (the stores and the front door in it)."""
    assert ai_lease.__all__ == sorted(ai_lease.__all__)
    assert ai_lease.__all__ == PUBLIC


def test_every_name_in_all_resolves() -> None:
    """Every name in __all__ resolves on the package (lazy ones included)."""
    missing = [n for n in ai_lease.__all__ if getattr(ai_lease, n, None) is None]
    assert missing == []


def test_all_is_sorted_and_complete() -> None:
    """No public name the package holds is missing from __all__."""
    public = {
        n
        for n, v in vars(ai_lease).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("ai_lease")
    }
    assert public <= set(ai_lease.__all__)
