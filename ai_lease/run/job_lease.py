"""A lease around your own code: the pipeline's keeper, fence and stall policy, no pipeline.

>>> async with client.lease("report-42", stage="load") as job:       # doctest: +SKIP
...     if job.done:                                # another node already stored the result
...         return job.result
...     rows = await load_rows(progress=job.progress)  # job.progress(marker) per real step
...     job.stage("call_ai", max_no_progress=90)
...     answer = await call_model(rows, on_token=job.progress)
...     await job.commit(answer)                    # fenced: a stale owner's write is refused

In the style of redis-py's ``Lock``: **entering** acquires the job's lease — or follows, if
another owner holds it, until its result is stored (then ``job.done`` is true and
``job.result`` holds it; the body decides what to do) or its lease lapses (then this one
owns it, with a higher fencing token). A FAILED job raises :class:`JobFailed`, a cancelled
one :class:`JobCancelled`. While the body runs, the same :class:`LeaseKeeper` as the
pipeline's renews the lease only while ``job.progress(...)`` says the work moves; a lost
lease, a refused renewal or a stall **cancels the body** (it sees ``CancelledError`` at
its next ``await``) and the block raises :class:`LeaseLost` / :class:`Stalled`.

**Leaving** without a commit steps down (the next owner starts at once); an exception
from the body is the attempt's failure: released with its error and counted (the store
ends the job FAILED after the retry policy's last attempt) and re-raised, or — bad input,
a non-retryable provider error — the job failed at once and :class:`JobFailed` raised from
the exception (its ``__cause__``), as a runner's attempt does: both end on one path,
:mod:`ai_lease.run.ending`.

Only the no-progress budgets apply: no stage or job deadline runs around the body (wrap it
in ``asyncio.timeout`` for one). Sync code in the body blocks the keeper too; run it with
``asyncio.to_thread`` and call ``job.progress`` from there (a plain attribute update).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ai_lease.errors import JobCancelled, JobFailed, LeaseError, LeaseLost
from ai_lease.job import Job, JobState, Status
from ai_lease.lease.base import Acquired, LeaseStore
from ai_lease.lease.events import EventSink
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.lease.keeper import LeaseKeeper, Renewals
from ai_lease.lease.progress import Progress
from ai_lease.run.context import StageContext
from ai_lease.run.ending import Ending
from ai_lease.timeouts import LeaseTimings, RetryPolicy, StageBudget, StallPolicy

__all__ = ["JobLease", "LeaseOptions"]


@dataclass(frozen=True, slots=True)
class LeaseOptions:
    """What a :class:`JobLease` runs under (the client's values, usually)."""

    timings: LeaseTimings
    retry: RetryPolicy
    stall_policy: StallPolicy
    on_event: EventSink | None = None


class JobLease:
    """The handle ``client.lease(key)`` gives: see the module docstring.

    ``done`` / ``result`` / ``record`` say what entering found; ``token`` is this owner's
    fencing token (None when the job was already DONE).
    """

    def __init__(
        self,
        store: LeaseStore,
        key: str,
        owner_id: str,
        options: LeaseOptions,
        *,
        stage: str = "load",
        max_no_progress: float | None = None,
    ) -> None:
        self.store, self.key, self.owner_id, self.options = store, key, owner_id, options
        self._first = (stage, max_no_progress)
        self.record: JobState | None = None
        self.progress_tracker = Progress()
        self._ctx: StageContext | None = None
        self._renewals: Renewals | None = None  # the keeper beside the body, once owned

    # -- what the body uses ----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True when the job was already DONE on entering: ``result`` holds its value."""
        return self.record is not None and self.record.status is Status.DONE

    @property
    def result(self) -> Any:
        """The stored result (decoded), if the job is DONE; else None."""
        return self.record.output if self.done and self.record is not None else None

    @property
    def token(self) -> int | None:
        return None if self._ctx is None else self._ctx.fence.token

    def progress(self, marker: Hashable | None = None) -> bool:
        """Mark a real step forward (a repeated ``marker`` is not progress); per chunk is fine."""
        return self._owned().progress(marker)

    def stage(self, name: str, *, max_no_progress: float | None = None) -> None:
        """Enter stage ``name``: its no-progress budget is ``max_no_progress`` or the
        timings' budget for ``name``. Entering a stage is progress."""
        ctx = self._owned()
        ctx.tracker.enter(name, self._budget(name, max_no_progress))

    def ensure_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease may have lapsed: call before a side effect."""
        self._owned().ensure_lease()

    async def commit(self, value: Any) -> JobState:
        """Store the job's one result (JSON), fenced and idempotent; the keeper stops.

        A stale owner (its lease lapsed and another took over) gets :class:`FencingRejected`.
        On a handle that found the job DONE, returns the stored record unchanged."""
        if self.done and self.record is not None:
            return self.record
        committed = await self._owned().commit(value)
        self.record = committed
        if self._renewals is not None:
            self._renewals.stop()
        return committed

    # -- entering and leaving --------------------------------------------------------------

    async def __aenter__(self) -> Self:
        timings = self.options.timings
        stage, budget = self._first
        clock = self.progress_tracker.clock
        sent = [clock()]

        def on_send() -> None:
            sent[0] = clock()

        outcome = await acquire_or_follow(
            self.store,
            self.key,
            self.owner_id,
            ttl=timings.ttl,
            max_no_progress=self._budget(stage, budget).max_no_progress,
            poll_interval=timings.poll_interval,
            stall_policy=self.options.stall_policy.value,
            max_attempts=self.options.retry.attempts,
            on_send=on_send,
        )
        self.record = outcome.job
        if not isinstance(outcome, Acquired):
            if outcome.job.status is Status.CANCELLED:
                raise JobCancelled(self.key, outcome.job.last_error)
            if outcome.job.status is not Status.DONE:
                raise JobFailed(self.key, outcome.job.last_error, outcome.job.ended_by)
            return self
        renewals = self._own(outcome, sent[0])
        await renewals.__aenter__()  # the body (this task) is what a lost lease cancels
        self._renewals = renewals
        return self

    def _own(self, acquired: Acquired, sent_at: float) -> Renewals:
        """Start keeping the lease: the keeper's task begins when its first renewal is due."""
        stage, budget = self._first
        tracker, timings = self.progress_tracker, self.options.timings
        tracker.enter(stage, self._budget(stage, budget))
        keeper = LeaseKeeper(
            self.store,
            acquired.fence,
            tracker,
            timings,
            valid_until=sent_at + acquired.job.lease_remaining,  # from when it was sent
            stall_policy=self.options.stall_policy,
            on_event=self.options.on_event,
        )
        self._ctx = StageContext(
            job=Job(self.key),
            fence=acquired.fence,
            store=self.store,
            tracker=tracker,
            keeper=keeper,
        )
        return Renewals(keeper)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if self._ctx is None or self._renewals is None:  # DONE on entering: nothing held
            return None
        renewals = self._renewals
        # The keeper's error (LeaseLost, Stalled) is raised here in place of the body's,
        # unless the body was also cancelled from outside (a shutdown wins).
        await renewals.__aexit__(exc_type, exc, tb)
        if renewals.failure or self._ctx.committed is not None:
            return None
        await self._step_down(exc)
        return None

    async def _step_down(self, exc: BaseException | None) -> None:
        """No commit: the attempt ends on the runner's path (:mod:`~ai_lease.run.ending`):
        handed back, released with its error, or — bad input, a non-retryable error — the job
        FAILED and :class:`JobFailed` raised from the error. A lease that is not ours any more
        is left alone."""
        ctx = self._owned()
        if isinstance(exc, LeaseError):
            return  # not ours any more: nothing to write
        timings, on_event = self.options.timings, self.options.on_event
        ending = Ending(self.store, ctx.fence, timings.op_timeout, on_event)
        if isinstance(exc, Exception):
            await ending.failed(exc)  # retryable: released, and the error goes on
        else:
            await ending.step_down()  # no error, or cancelled: handed back, uncounted

    # -- helpers -----------------------------------------------------------------------------

    def _owned(self) -> StageContext:
        if self._ctx is None:
            raise LeaseLost(
                self.key,
                "this handle holds no lease (the job was already DONE: read job.result)"
                if self.done
                else "use the handle inside its 'async with' block",
            )
        return self._ctx

    def _budget(self, stage: str, max_no_progress: float | None) -> StageBudget:
        base = self.options.timings.budget(stage)
        if max_no_progress is None:
            return base
        return StageBudget(max_no_progress, base.deadline)

    def __repr__(self) -> str:
        state = "done" if self.done else f"token {self.token}" if self._ctx else "not entered"
        return f"<JobLease {self.key!r} {state}>"
