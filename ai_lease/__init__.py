"""ai_lease: run AI jobs under a progress-aware lease, so a stuck owner can never hold a job
hostage.

The public names are re-exported here; import from ``ai_lease`` and nothing deeper.
"""

from .errors import (
    AiLeaseError,
    ConfigError,
    CorruptRecord,
    EmptyEventStream,
    FencingRejected,
    FirstTokenTimeout,
    InputError,
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
from .logs import JobLogger, configure_logging, fan_out
from .metrics import Metrics, serve_metrics
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
from .timeouts import (
    AdaptiveBudgets,
    LeaseTimings,
    RetryPolicy,
    StageBudget,
    StallPolicy,
    StreamLimits,
    StreamTimeouts,
)
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "Acquired",
    "AdaptiveBudgets",
    "AiLeaseError",
    "ChatRequest",
    "Completion",
    "ConfigError",
    "CorruptRecord",
    "Delta",
    "EmptyEventStream",
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
    "Usage",
    "Worker",
    "__version__",
    "available_providers",
    "configure_logging",
    "create_provider",
    "fan_out",
    "load_settings",
    "mask_url",
    "open_store",
    "serve_metrics",
]
