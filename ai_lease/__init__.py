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
from .events import Event
from .job import Health, Job, JobState, Status
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
from .pipeline import Pipeline, Stage, StageContext
from .progress import Progress
from .providers import (
    ChatRequest,
    Completion,
    Delta,
    Provider,
    Usage,
    available_providers,
    create_provider,
)
from .runner import Runner
from .settings import Settings, load_settings
from .streaming import StreamGuard
from .timeouts import LeaseTimings, RetryPolicy, StageBudget, StallPolicy, StreamTimeouts

__version__ = "0.1.0"

__all__ = [
    "Acquired",
    "AiLeaseError",
    "ChatRequest",
    "Completion",
    "ConfigError",
    "CorruptRecord",
    "Delta",
    "Event",
    "Fence",
    "FencingRejected",
    "Finished",
    "FirstTokenTimeout",
    "Following",
    "Health",
    "InputError",
    "Job",
    "JobConflict",
    "JobDeadlineExceeded",
    "JobFailed",
    "JobSpecError",
    "JobState",
    "LeaseError",
    "LeaseLost",
    "LeaseStore",
    "LeaseTimings",
    "Pipeline",
    "Progress",
    "Provider",
    "ProviderError",
    "Renewal",
    "RetryPolicy",
    "Runner",
    "Settings",
    "Stage",
    "StageBudget",
    "StageContext",
    "StageDeadlineExceeded",
    "StageTimeout",
    "StallPolicy",
    "Stalled",
    "Status",
    "StoreError",
    "StoreUnavailable",
    "StreamGuard",
    "StreamIdleTimeout",
    "StreamTimeouts",
    "StreamTotalTimeout",
    "Usage",
    "__version__",
    "available_providers",
    "create_provider",
    "load_settings",
    "mask_url",
    "open_store",
]
