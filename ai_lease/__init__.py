"""ai_lease: run AI jobs under a progress-aware lease, so a stuck owner can never hold a job
hostage.

The public names are re-exported here; import from ``ai_lease`` and nothing deeper.
"""

from .errors import (
    AiLeaseError,
    ConfigError,
    CorruptRecord,
    FencingRejected,
    FirstTokenTimeout,
    InputError,
    JobConflict,
    JobDeadlineExceeded,
    JobFailed,
    JobSpecError,
    LeaseError,
    LeaseLost,
    ProviderError,
    StageDeadlineExceeded,
    StageTimeout,
    Stalled,
    StoreError,
    StoreUnavailable,
    StreamIdleTimeout,
    StreamTotalTimeout,
)
from .job import Health, JobState, Status
from .lease import (
    Acquired,
    Fence,
    Finished,
    Following,
    LeaseStore,
    Renewal,
    mask_url,
    open_store,
)
from .timeouts import LeaseTimings, RetryPolicy, StageBudget, StallPolicy, StreamTimeouts

__version__ = "0.1.0"

__all__ = [
    "Acquired",
    "AiLeaseError",
    "ConfigError",
    "CorruptRecord",
    "Fence",
    "FencingRejected",
    "Finished",
    "FirstTokenTimeout",
    "Following",
    "Health",
    "InputError",
    "JobConflict",
    "JobDeadlineExceeded",
    "JobFailed",
    "JobSpecError",
    "JobState",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "LeaseTimings",
    "ProviderError",
    "Renewal",
    "RetryPolicy",
    "StageBudget",
    "StageDeadlineExceeded",
    "StageTimeout",
    "StallPolicy",
    "Stalled",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "StreamIdleTimeout",
    "StreamTimeouts",
    "StreamTotalTimeout",
    "__version__",
    "mask_url",
    "open_store",
]
