"""One attempt as owner: the pipeline with the lease keeper beside it, and what its end means.

An :class:`Attempt` starts once the runner holds the job's lease. It runs the pipeline under
the job's deadline (counted from the job's first acquisition on the store's clock) with the
keeper beside it (:func:`~ai_lease.lease.keeper.alongside`), and commits the result, fenced.
How it ends decides what the runner does next:

* committed — the DONE record is returned;
* a stale owner (:class:`FencingRejected`) — follow the new owner at once;
* stalled — stand aside long enough for another node to take over first;
* lease lost — compete again after one poll interval;
* (for a stale owner and a lost lease, ``lease_gone`` is set — unless the store lost the
  record itself — and a worker's runner, which does not follow, frees the slot at once
  instead: the job's recovery look brings it back);
* failed — bad input or a non-retryable error fails the job at once, anything else is
  released with its error and retried after the job retry policy's backoff;
* cancelled from outside (a shutdown) — step down: the attempt is handed back, not failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ai_lease.errors import (
    FencingRejected,
    JobDeadlineExceeded,
    JobFailed,
    LeaseError,
    Stalled,
)
from ai_lease.failure import FailureKind, kind_of
from ai_lease.job import Job, JobState
from ai_lease.lease.base import Acquired, Fence, LeaseStore
from ai_lease.lease.classify import describe
from ai_lease.lease.events import Event
from ai_lease.lease.fence import UnansweredCommits, fenced_event
from ai_lease.lease.keeper import LeaseKeeper, alongside
from ai_lease.lease.progress import Progress
from ai_lease.refusal import Refusal
from ai_lease.run.call_notes import CallNotes
from ai_lease.run.context import StageContext
from ai_lease.run.emitter import Emitter
from ai_lease.run.ending import Ending
from ai_lease.timeouts import LeaseTimings, StallPolicy

if TYPE_CHECKING:
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers.base import Provider
    from ai_lease.retry import RetryPolicy
    from ai_lease.run.config import RunConfig, RunHooks
    from ai_lease.run.pipeline import Pipeline

__all__ = ["Attempt", "AttemptHost"]


class AttemptHost(Protocol):
    """What an attempt takes from the runner that makes it (a :class:`~ai_lease.Runner` is
    one): the store, what it runs and under which values, and where its events go."""

    store: LeaseStore
    pipeline: Pipeline
    prompts: PromptLibrary
    config: RunConfig
    hooks: RunHooks
    timings: LeaseTimings
    retry: RetryPolicy
    stall_policy: StallPolicy
    commits: UnansweredCommits
    events: Emitter

    def using_provider(self, job: Job) -> AbstractAsyncContextManager[Provider | None]:
        """The provider that runs ``job``, held while the attempt runs."""
        ...


class Attempt:
    """One attempt of ``job`` as the owner of ``acquired`` (see the module docstring), made by
    ``host`` (the runner). ``sent_at``: when (monotonic clock) the acquire that granted the
    lease was sent."""

    def __init__(
        self,
        host: AttemptHost,
        job: Job,
        acquired: Acquired,
        prepared: Mapping[str, Any],
        sent_at: float,
    ) -> None:
        self.host, self.job, self.acquired = host, job, acquired
        self.prepared, self.sent_at = prepared, sent_at
        self.fence = acquired.fence
        self.events = host.events
        self.timings = host.timings
        self.ran: dict[str, Any] = {}  # what this attempt ran (the stage context's ``ran``)
        self.lease_gone = False  # ended without the lease (fenced off, lost, self-fenced)
        self.notes = CallNotes()  # owns the notes of calls cancelled mid-way (see _ended)
        self.ending = Ending(
            host.store, self.fence, self.timings.op_timeout, self.events.emit_event, self._ran
        )

    async def run(self) -> JobState | float:
        """Returns the DONE record, or how long to stand aside (following only) before
        competing again."""
        fence, record, takeover = self.fence, self.acquired.job, self.acquired.takeover
        note = " (takeover)" if takeover else ""
        self.events.emit("acquired", fence.key, fence, f"attempt {record.attempts}{note}")
        if takeover and self.events.wants("takeover"):
            self.events.emit_event(_takeover(fence, record, self.acquired.cause))
        # The job deadline runs from the first acquisition: queue time has its own bound.
        started = record.read_at if record.started_at is None else record.started_at
        if started - record.created_at > self.timings.queue_deadline:
            reason = (
                f"job {fence.key!r} waited {started - record.created_at:.1f}s in the queue, "
                f"past its queue deadline of {self.timings.queue_deadline:g}s "
                "(lease.queue_deadline)"
            )
            await self.fail(reason, FailureKind.QUEUE_DEADLINE)
            raise JobFailed(fence.key, reason, FailureKind.QUEUE_DEADLINE)
        left = self.timings.job_deadline - (record.read_at - started)
        self.host.commits.expect(fence)  # until the attempt has its commit's answer
        committed = await self._ended(left)
        if isinstance(committed, JobState):
            self.host.commits.answered(fence)
        return committed

    async def _ended(self, left: float) -> JobState | float:
        """The attempt, and what its end means for the runner (see the module docstring)."""
        fence, timings = self.fence, self.timings
        try:
            return await self._own(left)
        except asyncio.CancelledError:
            try:
                await self.ending.step_down()  # e.g. a worker shutting down: hand over at once
            finally:
                await self.notes.close(wait=0.0)  # no longer than the step-down: the rest dropped
            raise
        except FencingRejected as exc:
            self.events.emit_event(fenced_event(fence, exc))
            self.lease_gone = _recorded(exc)
            return 0.0  # someone else owns it now: follow them
        except Stalled as exc:
            # Our work was stuck: let the other nodes take over first, rather than racing
            # them for the lease we are letting lapse (a zombie should not win it back).
            self.events.emit("retry", fence.key, fence, str(exc))
            lapse = timings.ttl if self.host.stall_policy is StallPolicy.EXPIRE else 0.0
            return lapse + 2 * timings.poll_interval + self._backoff()
        except LeaseError as exc:
            self.lease_gone = _recorded(exc)
            self.events.emit("retry", fence.key, fence, str(exc))
            return timings.poll_interval
        except JobDeadlineExceeded as exc:
            await self.fail(describe(exc), kind_of(exc))  # named like every other failure
            raise
        except Exception as exc:
            return await self._failed(exc)
        finally:
            await self.notes.close()  # the notes of calls cancelled inside, at most 2 s

    def _ran(self) -> dict[str, Any]:
        return self.ran  # what ran, recorded on a FAILED job

    def _backoff(self) -> float:
        """How long to wait after this attempt: the job retry policy's backoff."""
        return self.host.retry.backoff(self.acquired.job.attempts)

    async def _failed(self, exc: Exception) -> float:
        """The attempt's own failure: fail the job (not retryable) or release and retry."""
        fence = self.fence
        await self.ending.failed(exc)  # not retryable: the job FAILED, JobFailed raised
        if self.acquired.job.attempts >= self.host.retry.attempts:
            return 0.0  # the next acquire ends the job FAILED with this error
        backoff = self._backoff()
        self.events.emit("retry", fence.key, fence, f"{describe(exc)}; retrying in {backoff:g}s")
        return backoff

    async def _own(self, left: float) -> JobState:
        """Run the pipeline with the keeper beside it, under the job's deadline; commit."""
        host, events, progress = self.host, self.events, Progress()
        started = progress.clock()
        keeper = self._keeper(progress)
        deadline = asyncio.timeout(max(left, 0.0))
        async with host.using_provider(self.job) as provider:  # never evicted while in use
            ctx = self._context(progress, keeper, provider)
            keeper.checkpoint = ctx.checkpoint_json  # each renewal stores the checkpoint
            self.ran = ctx._run.ran
            try:
                async with deadline:
                    emit = events.emit_event if events.listening else None
                    value = await alongside(host.pipeline.run(ctx, self.timings, emit), keeper)
            except TimeoutError:
                if deadline.expired():
                    raise JobDeadlineExceeded(self.job.key, self.timings.job_deadline) from None
                raise
            committed = ctx.committed or await ctx.commit(value)
        if events.wants("committed"):
            events.emit_event(
                Event(
                    "committed",
                    self.job.key,
                    self.fence.owner_id,
                    self.fence.token,
                    progress.stage,
                    progress.idle(),
                    "one result stored",
                    value=progress.clock() - started,
                    attrs={"progress": progress.version - keeper.reported_version},
                )
            )
        return committed

    def _keeper(self, progress: Progress) -> LeaseKeeper:
        return LeaseKeeper(
            self.host.store,
            self.fence,
            progress,
            self.timings,
            # Counted from when the acquire was sent (the store granted it later): a loop
            # blocked after the reply cannot make us believe in a lease that has lapsed.
            valid_until=self.sent_at + self.acquired.job.lease_remaining,
            stall_policy=self.host.stall_policy,
            on_event=self.events.emit_event,
        )

    def _context(
        self, progress: Progress, keeper: LeaseKeeper, provider: Provider | None
    ) -> StageContext:
        host, config, hooks = self.host, self.host.config, self.host.hooks
        return StageContext(
            job=self.job,
            fence=self.fence,
            store=host.store,
            tracker=progress,
            keeper=keeper,
            provider=provider,
            prompts=host.prompts,
            stream_timeouts=config.stream_timeouts,
            stream_limits=config.stream_limits,
            limits=config.limits,
            persist_hook=hooks.persist_hook,
            call_retry=config.call_retry,
            fault_hook=hooks.fault,
            prepared=self.prepared,
            resume_from=self.acquired.job.checkpoint,  # an earlier owner's stream, if any
            notes=self.notes,
            wants=self.events.wants,
        )

    # -- handing the lease back: the one path JobLease takes too (run/ending.py) ------------

    async def fail(self, reason: str, kind: FailureKind) -> None:
        """End the job FAILED with ``reason`` and ``kind`` (fenced: a stale owner's verdict
        is refused)."""
        await self.ending.fail(reason, kind)


def _recorded(exc: LeaseError) -> bool:
    """Whether the store still records the job after ``exc`` (not so after a Redis restart
    without its data: then only this owner's next acquire re-creates it)."""
    return getattr(exc, "code", None) != Refusal.MISSING.value


def _takeover(fence: Fence, record: JobState, cause: str | None) -> Event:
    """The ``takeover`` event: another node's job taken, and why it was free."""
    detail = f"previous attempts {record.attempts - 1}; cause {cause or 'unknown'}"
    return Event(
        "takeover",
        fence.key,
        fence.owner_id,
        fence.token,
        detail=detail,
        attrs={"cause": cause or "", "takeovers": record.takeovers},
    )
