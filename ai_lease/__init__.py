"""ai_lease: run AI jobs under a progress-aware lease, so a stuck owner can never hold a job
hostage.

The public names are re-exported here; import from ``ai_lease`` and nothing deeper.
The front door is :func:`connect`::

    async with ai_lease.connect("sqlite:///.ai-lease/jobs.db") as client:
        record = await client.run(ai_lease.Job("report-42", input="Long text…"))
"""

from typing import TYPE_CHECKING, Any

from .client import Client, SyncClient, connect, run_sync
from .errors import (
    AiLeaseError,
    ConfigError,
    CorruptRecord,
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
from .lease.handle import JobLease
from .lease.sqlite import SQLiteStore
from .logs import JobLogger, configure_logging, fan_out
from .metrics import Metrics, serve_metrics
from .pipeline import Pipeline, Stage, StageContext
from .progress import Progress
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

if TYPE_CHECKING:
    from .lease.redis import RedisStore

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # RedisStore on first use: importing redis-py costs start-up time nobody on SQLite needs.
    if name == "RedisStore":
        from .lease.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'ai_lease' has no attribute {name!r}")


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
    "Progress",
    "PromptLibrary",
    "Provider",
    "ProviderError",
    "RedisStore",
    "Renewal",
    "RetryPolicy",
    "Runner",
    "SQLiteStore",
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
