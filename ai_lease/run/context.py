"""What a stage gets: the :class:`StageContext` of one attempt, and the hooks it calls.

The runner (:class:`~ai_lease.run.attempt.Attempt`) builds one context per attempt; each
stage of the :class:`~ai_lease.run.pipeline.Pipeline` takes it, reads earlier outputs from
it, marks progress on it and commits the result through it, fenced.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

import orjson

from ai_lease.errors import JobSpecError, LeaseLost
from ai_lease.job import Job, JobState, RunFacts
from ai_lease.lease.base import Fence, LeaseStore
from ai_lease.lease.call_limits import CallLimits
from ai_lease.lease.events import Event, EventSink
from ai_lease.lease.fence import fenced_commit
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.lease.progress import Progress
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import Checkpoint, Provider
from ai_lease.retry import MODEL_CALL, RetryPolicy
from ai_lease.run.call_notes import CallNotes
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StageBudget, StreamLimits, StreamTimeouts

__all__ = ["AttemptState", "FaultHook", "PersistHook", "StageContext", "SubStage"]

PersistHook = Callable[["StageContext", Any], Awaitable[None] | None]
"""Called with the context and the value before the result is committed (fenced: a lost
lease stops it); installed through :class:`~ai_lease.run.config.RunHooks`."""

FaultHook = Callable[[str], Awaitable[None]]
"""Called at each named fault point (``before:<stage>``, ``after:<stage>``, ``before_commit``,
``after_commit``); tests install one (:class:`ai_lease.testing.faults.FaultPlan`)."""


@dataclass
class AttemptState:
    """What the runner keeps for one attempt behind the stages' view (``ctx._run``): the
    store and the keeper, the model call's settings and hooks, what ran, and a resumable
    stream's state. Internal: a stage uses :class:`StageContext`'s public names."""

    store: LeaseStore
    keeper: LeaseKeeper
    provider: Provider | None = None
    prompts: PromptLibrary = field(default_factory=PromptLibrary)
    stream_timeouts: StreamTimeouts = field(default_factory=StreamTimeouts)
    stream_limits: StreamLimits = field(default_factory=StreamLimits)
    persist_hook: PersistHook | None = None
    call_retry: RetryPolicy = MODEL_CALL
    fault_hook: FaultHook | None = None  # tests only: see ai_lease.testing.faults
    emit: EventSink | None = None
    wants: Callable[[str], bool] | None = None  # whether a sink takes a kind (None: all do)
    prepared: Mapping[str, Any] = field(default_factory=dict)  # outputs preflight worked out
    ran: dict[str, Any] = field(default_factory=dict)  # what ran: RunFacts' fields, recorded
    finish_reason: str | None = None  # the model call's, kept in the committed record
    deadline_at: float | None = None  # the running stage's hard deadline (monotonic clock)
    hard: Any = None  # the pipeline's deadline timer (run/pipeline.py): a slot wait pauses it
    limits: CallLimits = field(default_factory=CallLimits)  # [limits]: run/slot_call.py
    # Resuming a stream after a takeover (issue 15): the record's checkpoint as acquired, the
    # model calls made so far (each one's X-Request-Id ends in its number), and the running
    # stream's latest checkpoint with the guard collecting its text (the keeper's renewals
    # store both, serialised by checkpoint_json).
    resume_from: str | None = None
    calls: int = 0
    checkpoint: Checkpoint | None = None
    guard: StreamGuard | None = None
    serialised: tuple[Checkpoint, str] | None = field(default=None, repr=False)
    # The notes of calls cancelled mid-way: owned here, closed when the attempt ends.
    notes: CallNotes = field(default_factory=CallNotes, repr=False)


class StageContext:
    """What a stage gets: the job (``input``), earlier outputs (:meth:`output`), the
    progress handle (:meth:`progress`, ``tracker``), named steps (:meth:`stage`), the
    fence, :meth:`say` and :meth:`commit`. The runner's own state for the attempt (store,
    keeper, hooks, the stream being resumed) is kept apart, in ``_run``."""

    def __init__(
        self,
        job: Job,
        fence: Fence,
        store: LeaseStore,
        tracker: Progress,
        keeper: LeaseKeeper,
        **run: Any,
    ) -> None:
        self.job, self.fence, self.tracker = job, fence, tracker
        self.outputs: dict[str, Any] = {}
        self.committed: JobState | None = None  # the stored record, once committed
        self._run = AttemptState(store, keeper, **run)  # provider=, prompts=, … (its fields)

    @property
    def input(self) -> Any:
        """The job's input."""
        return self.job.input

    def __repr__(self) -> str:
        return f"<StageContext {self.job.key!r} token {self.fence.token} {self.tracker.stage!r}>"

    def say(
        self,
        kind: str,
        detail: str = "",
        *,
        stage: str | None = None,
        value: float | None = None,
        attrs: dict[str, float | int | str] | None = None,
    ) -> None:
        """Emit an event about this job (for logs, metrics, traces, the live view)."""
        emit, wants = self._run.emit, self._run.wants
        if emit is not None and (wants is None or wants(kind)):
            fence = self.fence
            emit(
                Event(
                    kind,
                    fence.key,
                    fence.owner_id,
                    fence.token,
                    stage or self.tracker.stage,
                    self.tracker.idle(),
                    detail,
                    value=value,
                    attrs=attrs,
                )
            )

    def progress(self, marker: Hashable | None = None) -> bool:
        """Mark a real step forward (a repeated ``marker`` is not progress)."""
        return self.tracker.progress(marker)

    def stage(self, name: str, *, max_no_progress: float | None = None) -> SubStage:
        """A named step inside the running stage: ``async with ctx.stage("rerank"):``.

        Entering and leaving it are progress; while it runs, the keeper, the events and
        the model calls name it (a stall says ``rerank``, not the stage around it) and its
        no-progress budget is ``max_no_progress`` (default: the stage's). The stage's hard
        deadline still runs around it. It says ``stage`` and ``stage_done`` (``value``: its
        seconds) events, ``attrs`` ``within`` naming the stage around it."""
        return SubStage(self, name, max_no_progress)

    def note_checkpoint(self, point: Checkpoint) -> None:
        """A resumable stream's checkpoint (``ChatRequest.on_checkpoint``): kept, not sent;
        the keeper's next renewal stores it."""
        self._run.checkpoint = point

    def checkpoint_json(self) -> str | None:
        """The running stream's checkpoint as the record keeps it (the keeper's source):
        ``{"provider", "response_id", "sequence", "text"}``, the text being all the guard has
        collected (joined here, at renewal time, never per chunk); None without one."""
        run = self._run
        point, guard = run.checkpoint, run.guard
        if point is None or guard is None:
            return None
        done = run.serialised
        if done is not None and done[0] is point:  # nothing new since the last renewal
            return done[1]
        blob = orjson.dumps(
            {
                "provider": point.provider,
                "response_id": point.response_id,
                "sequence": point.sequence,
                "text": "".join(guard.text_parts),
            }
        ).decode()
        run.serialised = (point, blob)
        return blob

    def output(self, stage: str) -> Any:
        """The value an earlier stage returned."""
        try:
            return self.outputs[stage]
        except KeyError:
            raise JobSpecError(f"stage output {stage!r} is not available yet") from None

    async def fault(self, point: str) -> None:
        """A named fault point (a no-op unless a test installed a fault hook)."""
        hook = self._run.fault_hook
        if hook is not None:
            await hook(point)

    def ensure_lease(self) -> None:
        """Raise LeaseLost if our lease may have lapsed: call before any side effect."""
        self._run.keeper.ensure_lease()

    def lease_lapsed(self) -> LeaseLost | None:
        """The lost lease's error if the lease may have lapsed by now (the process was
        stopped past its self-fence point), else None; quietly: the keeper says it. (A
        process-isolated child has no self-fence: its parent fences.)"""
        fence = getattr(self._run.keeper, "self_fence", None)
        if fence is None:
            return None
        late = fence.overdue()
        return fence.lost(late) if late >= 0 else None

    async def commit(self, value: Any) -> JobState:
        """Write the job's one result: fenced and idempotent. Returns the stored record."""
        run = self._run
        self.ensure_lease()
        if run.persist_hook is not None:
            pending = run.persist_hook(self, value)
            if inspect.isawaitable(pending):
                await pending
            self.ensure_lease()
        blob = orjson.dumps(value).decode()
        await self.fault("before_commit")
        keeper = run.keeper
        keeper.commit_started()
        return await fenced_commit(
            run.store,
            self.fence,
            blob,
            finish_reason=run.finish_reason,
            facts=RunFacts(**run.ran),
            after=self._committed,
            valid_until=lambda: keeper.valid_until,  # resent while the lease holds
            clock=keeper.clock,
        )

    async def _committed(self, record: JobState) -> None:
        self.committed = record
        await self.fault("after_commit")


class SubStage:
    """A named step of a stage (:meth:`StageContext.stage`): an ``async with`` block."""

    def __init__(self, ctx: StageContext, name: str, max_no_progress: float | None) -> None:
        self.ctx, self.name, self.max_no_progress = ctx, name, max_no_progress
        self._around: tuple[str | None, StageBudget] | None = None
        self._started = 0.0

    async def __aenter__(self) -> Self:
        tracker = self.ctx.tracker
        around = (tracker.stage, tracker.budget)
        limit = around[1].max_no_progress if self.max_no_progress is None else self.max_no_progress
        tracker.enter(self.name, StageBudget(limit, around[1].deadline))
        self._around, self._started = around, tracker.clock()
        self.ctx.say("stage", f"max_no_progress {limit:g}s", attrs={"within": around[0] or ""})
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if self._around is None:
            return
        tracker, (stage, budget) = self.ctx.tracker, self._around
        took = tracker.clock() - self._started
        if exc_type is None:
            self.ctx.say("stage_done", stage=self.name, value=took, attrs={"within": stage or ""})
        if stage is not None:
            tracker.enter(stage, budget)  # back in the stage around it: progress
