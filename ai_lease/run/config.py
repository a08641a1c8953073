"""What a :class:`~ai_lease.Runner` runs under: one frozen :class:`RunConfig` of values, and
:class:`RunHooks`, the callables it calls back.

>>> config = RunConfig(timings=LeaseTimings(ttl=30, renew_interval=5), node_id="api-1")
>>> runner = Runner(store, provider=provider, config=config,
...                 hooks=RunHooks(on_event=metrics))                # doctest: +SKIP

The CLI builds its config from the settings (:meth:`ai_lease.Settings.run_config`); the
library never reads the environment itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ai_lease.inputs import DEFAULT_MAX_INPUT_BYTES
from ai_lease.lease.call_limits import CallLimits
from ai_lease.retry import JOB_ATTEMPTS, MODEL_CALL, RetryPolicy
from ai_lease.timeouts import (
    AdaptiveBudgets,
    LeaseTimings,
    StallPolicy,
    StreamLimits,
    StreamTimeouts,
)

if TYPE_CHECKING:
    from ai_lease.lease.events import EventSink
    from ai_lease.run.context import FaultHook, PersistHook

__all__ = ["RunConfig", "RunHooks"]


@dataclass(frozen=True)
class RunConfig:
    """The runner's values.

    ``timings``: how leases are held (and the stage budgets); ``retry``: attempts of the
    whole job (:data:`~ai_lease.retry.JOB_ATTEMPTS`); ``call_retry``: retries of one model
    call (:data:`~ai_lease.retry.MODEL_CALL`); ``stream_timeouts`` / ``stream_limits``: a
    streamed call's budgets and sizes; ``stall_policy``: what a stall does (None: the
    timings'); ``adaptive``: learned budgets (None: off); ``max_input_bytes``: the largest
    ``input_file`` read; ``limits``: the provider slots a model call holds, shared through
    the store (:class:`~ai_lease.lease.call_limits.CallLimits`; none: no slot, no cost);
    ``pipeline_name``: the name durations are recorded under;
    ``node_id``: this node in records and logs (None: ``host:pid``); ``record_history``:
    record stage durations in the store; ``trace``: OpenTelemetry spans, when installed.
    """

    timings: LeaseTimings = field(default_factory=LeaseTimings)
    retry: RetryPolicy = JOB_ATTEMPTS
    stream_timeouts: StreamTimeouts = field(default_factory=StreamTimeouts)
    stream_limits: StreamLimits = field(default_factory=StreamLimits)
    call_retry: RetryPolicy = MODEL_CALL
    stall_policy: StallPolicy | None = None
    adaptive: AdaptiveBudgets | None = None
    max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    limits: CallLimits = field(default_factory=CallLimits)
    pipeline_name: str = "default"
    node_id: str | None = None
    record_history: bool = True
    trace: bool = True


@dataclass(frozen=True)
class RunHooks:
    """The runner's callbacks: ``on_event`` sees every event (logs, metrics, a live view);
    ``persist_hook`` runs before the result is committed (fenced: a lost lease stops it);
    ``fault`` is called at each fault point (tests only: see
    :data:`~ai_lease.run.context.FaultHook`)."""

    on_event: EventSink | None = None
    persist_hook: PersistHook | None = None
    fault: FaultHook | None = None
