"""ai_lease: run AI jobs under a progress-aware lease, so a stuck owner can never hold a job
hostage.

The public names are re-exported here; import from ``ai_lease`` and nothing deeper.
The front door is :func:`connect`::

    async with ai_lease.connect("sqlite:///.ai-lease/jobs.db") as client:
        record = await client.run(ai_lease.Job("report-42", input="Long text…"))

Each name is imported on first use (PEP 562 ``__getattr__``), so ``import ai_lease`` (and
``ai-lease --help``) does not pay for the pipeline, the providers, redis-py or the settings.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, eagerly, for type checkers; _LAZY serves them at run time
    from .client import Client, connect
    from .errors import (
        AiLeaseError,
        ConfigError,
        CorruptRecord,
        EmptyAnswer,
        EmptyEventStream,
        FencingRejected,
        FirstTokenTimeout,
        InputError,
        JobCancelled,
        JobConflict,
        JobDeadlineExceeded,
        JobFailed,
        JobSpecError,
        LeaseError,
        LeaseLost,
        OutcomeUnknown,
        ProviderError,
        StageDeadlineExceeded,
        StageTimeout,
        Stalled,
        StoreDataLost,
        StoreError,
        StoreUnavailable,
        StreamIdleTimeout,
        StreamInterrupted,
        StreamLimitExceeded,
        StreamTotalTimeout,
    )
    from .failure import FailureKind
    from .job import Health, Job, JobState, Status
    from .lease import (
        Acquired,
        Fence,
        Finished,
        Following,
        LeaseStore,
        Renewal,
    )
    from .lease.admin import Removal
    from .lease.events import Event
    from .lease.progress import Progress
    from .lease.slot_hold import SlotHold
    from .lease.slots import SlotLost, SlotWaitTimeout
    from .observe.logs import JobLogger, configure_logging, fan_out
    from .observe.metrics import Metrics, serve_metrics
    from .prompts import PromptLibrary
    from .providers import (
        ChatRequest,
        Completion,
        Delta,
        Provider,
        Usage,
        available_providers,
        create_provider,
    )
    from .redaction import mask_url
    from .refusal import Refusal
    from .retry import RetryPolicy
    from .run.config import RunConfig, RunHooks
    from .run.context import StageContext
    from .run.job_lease import JobLease
    from .run.pipeline import Pipeline, Stage
    from .run.runner import Runner
    from .run.stream_guard import StreamGuard
    from .run.worker import Worker
    from .settings import Settings, load_settings
    from .stores import open_store
    from .stores.postgres import PostgresStore
    from .stores.redis import RedisStore
    from .stores.sqlite import SQLiteStore
    from .sync_client import SyncClient, run_sync
    from .timeouts import (
        AdaptiveBudgets,
        LeaseTimings,
        StageBudget,
        StallPolicy,
        StreamLimits,
        StreamTimeouts,
    )

# Each public name and the module that defines it (relative to this package).
_LAZY: dict[str, str] = {
    "Acquired": ".lease",
    "AdaptiveBudgets": ".timeouts",
    "AiLeaseError": ".errors",
    "ChatRequest": ".providers",
    "Client": ".client",
    "Completion": ".providers",
    "ConfigError": ".errors",
    "CorruptRecord": ".errors",
    "Delta": ".providers",
    "EmptyAnswer": ".errors",
    "EmptyEventStream": ".errors",
    "Event": ".lease.events",
    "Fence": ".lease",
    "FencingRejected": ".errors",
    "Finished": ".lease",
    "FirstTokenTimeout": ".errors",
    "Following": ".lease",
    "Health": ".job",
    "InputError": ".errors",
    "Job": ".job",
    "JobCancelled": ".errors",
    "JobConflict": ".errors",
    "JobDeadlineExceeded": ".errors",
    "JobFailed": ".errors",
    "JobLease": ".run.job_lease",
    "JobLogger": ".observe.logs",
    "JobSpecError": ".errors",
    "JobState": ".job",
    "LeaseError": ".errors",
    "LeaseLost": ".errors",
    "LeaseStore": ".lease",
    "LeaseTimings": ".timeouts",
    "Metrics": ".observe.metrics",
    "OutcomeUnknown": ".errors",
    "Pipeline": ".run.pipeline",
    "Progress": ".lease.progress",
    "PromptLibrary": ".prompts",
    "Provider": ".providers",
    "ProviderError": ".errors",
    "PostgresStore": ".stores.postgres",
    "RedisStore": ".stores.redis",
    "Refusal": ".refusal",
    "FailureKind": ".failure",
    "Removal": ".lease.admin",
    "Renewal": ".lease",
    "RetryPolicy": ".retry",
    "RunConfig": ".run.config",
    "RunHooks": ".run.config",
    "Runner": ".run.runner",
    "SQLiteStore": ".stores.sqlite",
    "Settings": ".settings",
    "SlotHold": ".lease.slot_hold",
    "SlotLost": ".lease.slots",
    "SlotWaitTimeout": ".lease.slots",
    "Stage": ".run.pipeline",
    "StageBudget": ".timeouts",
    "StageContext": ".run.context",
    "StageDeadlineExceeded": ".errors",
    "StageTimeout": ".errors",
    "StallPolicy": ".timeouts",
    "Stalled": ".errors",
    "Status": ".job",
    "StoreDataLost": ".errors",
    "StoreError": ".errors",
    "StoreUnavailable": ".errors",
    "StreamGuard": ".run.stream_guard",
    "StreamIdleTimeout": ".errors",
    "StreamInterrupted": ".errors",
    "StreamLimitExceeded": ".errors",
    "StreamLimits": ".timeouts",
    "StreamTimeouts": ".timeouts",
    "StreamTotalTimeout": ".errors",
    "SyncClient": ".sync_client",
    "Usage": ".providers",
    "Worker": ".run.worker",
    "available_providers": ".providers",
    "configure_logging": ".observe.logs",
    "connect": ".client",
    "create_provider": ".providers",
    "fan_out": ".observe.logs",
    "load_settings": ".settings",
    "mask_url": ".redaction",
    "open_store": ".stores",
    "run_sync": ".sync_client",
    "serve_metrics": ".observe.metrics",
}

__version__ = "0.1.0"

__all__ = [
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


if not TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error for them

    def __getattr__(name: str) -> Any:
        """Import a public name on first use, then keep it as a plain module attribute."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
