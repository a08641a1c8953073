"""The lease keeper: the owner's heartbeat, which renews only while the job makes progress.

Every ``renew_interval`` it compares the time since the last real progress (monotonic
clock) with the current stage's ``max_no_progress``:

* within budget: renew, sending stage, budget and progress version (the store checks too),
  and the work's current checkpoint (``checkpoint``, a callable: where a resumable stream
  stood) when it changed since the last granted renewal;
* over budget: skip the renewal; after ``stall_after_misses`` skips the job has **stalled**:
  a snapshot of where the work is stuck goes into the job record, and the stall policy
  decides: ``expire`` (let the lease lapse), ``release`` (step down at once) — both raise
  :class:`Stalled`, cancelling the work — or ``alert`` (keep renewing, record and count);
* renewal refused (lease lost, newer token): raise :class:`LeaseLost` at once — unless the
  owner's fenced commit is on its way (:meth:`LeaseKeeper.commit_started`): from then on the
  commit's own answer decides (the store fences it), so the keeper stops renewing and a
  refusal it meets (``not_running``: the commit landed first) stops nothing;
* store unreachable: keep trying, and raise :class:`LeaseLost` before the lease could have
  lapsed (``self_fence_margin`` ahead, on the local monotonic clock, counted from when the
  last successful renewal was *sent*): the owner fences itself.

It runs beside the work (:func:`alongside`, or :class:`Renewals` for a body that is not one
awaitable), in a task group that owns it, started only when its first renewal is due (most
short jobs end before: they never pay for a task); raising is how it stops the work, through
an ``asyncio.timeout`` scope around the work: the keeper and the work are one unit — a lost
lease cancels the work, a failure of either stops both, and the keeper never outlives the
work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from ai_lease.errors import LeaseLost, Stalled, StoreUnavailable
from ai_lease.lease.base import Fence, LeaseStore, checkpoint_problem
from ai_lease.lease.events import Event, EventSink
from ai_lease.lease.fence import SelfFence
from ai_lease.lease.progress import Progress
from ai_lease.lease.queue import due_now
from ai_lease.lease.snapshot import snapshot
from ai_lease.timeouts import LeaseTimings, StallPolicy

__all__ = ["LeaseKeeper", "Renewals", "alongside"]

T = TypeVar("T")

log = logging.getLogger("ai_lease.keeper")

CheckpointSource = Callable[[], str | None]
"""Where the work's resumable stream stands now, as the record keeps it (None: nowhere)."""

StallHook = Callable[[str, float], Awaitable[str]]
"""Called when the work has stalled, before its snapshot is stored: given the keeper's
snapshot text and the seconds since the last progress, returns the text to store (process
isolation puts the stuck child's stacks and figures there)."""


class LeaseKeeper:
    """Keeps one owner's lease while its job makes progress. See the module docstring."""

    def __init__(
        self,
        store: LeaseStore,
        fence: Fence,
        progress: Progress,
        timings: LeaseTimings,
        *,
        valid_until: float,
        stall_policy: StallPolicy | None = None,
        on_event: EventSink | None = None,
        checkpoint: CheckpointSource | None = None,
        on_stall: StallHook | None = None,
    ) -> None:
        self.store, self.fence, self.progress, self.timings = store, fence, progress, timings
        self.clock = progress.clock
        self.self_fence = SelfFence(fence, valid_until, timings.self_fence_margin, self.clock)
        self.policy = StallPolicy(stall_policy or timings.stall_policy)
        self.misses = 0
        self.stalled_at: float | None = None  # local monotonic time of the stall, if any
        self.reported_version = progress.version  # progress counted into "renewed" events
        self.alerted_version: int | None = None
        self.work: asyncio.Task[Any] | None = None  # the task to snapshot when stalled
        self.started_at = self.clock()  # renewals are due every renew_interval from here
        self._emit = on_event or (lambda event: None)
        self._committing = False
        self.checkpoint = checkpoint  # asked at each renewal (may be set after construction)
        self._stored_checkpoint: str | None = None  # the last one a granted renewal stored
        self.on_stall = on_stall  # may be set after construction, like ``checkpoint``

    # -- local checks (cheap; used by the pipeline before any side effect) ---------------------

    @property
    def valid_until(self) -> float:
        """Local monotonic time the lease surely lasts until."""
        return self.self_fence.valid_until

    @property
    def fence_at(self) -> float:
        """Local monotonic time at which the owner must stop working without a renewal."""
        return self.self_fence.fence_at

    def ensure_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease may have lapsed (e.g. the loop was blocked)."""
        late = self.self_fence.overdue()
        if late >= 0:
            self._event("self_fenced", detail=f"{late:.2f}s past the self-fence point")
            raise self.self_fence.lost(late)

    def commit_started(self) -> None:
        """The owner's fenced commit is being sent: its answer, not the keeper, decides now.
        No renewal is sent after this, and one already in flight cannot stop the work."""
        self._committing = True

    # -- the loop -----------------------------------------------------------------------------

    def first_wake(self) -> float:
        """When :meth:`run` first has something to do (its clock): the first renewal, or
        the self-fence point if that comes first. Until then the keeper need not exist."""
        return min(self.started_at + self.timings.renew_interval, self.fence_at)

    async def run(self) -> NoReturn:
        """Tick every renew interval until something raises (never returns)."""
        next_tick = self.started_at + self.timings.renew_interval
        while True:
            wake = min(next_tick, self.fence_at)
            await asyncio.sleep(max(0.0, wake - self.clock()))
            if self._committing:  # parked until the work (the commit) is over
                await asyncio.Future()
            self.ensure_lease()
            if self.clock() >= next_tick:
                next_tick += self.timings.renew_interval
                await self.tick()

    async def tick(self) -> None:
        """One renewal decision."""
        budget = self.progress.budget.max_no_progress
        idle = self.progress.idle()
        if idle > budget:
            if self.policy is not StallPolicy.ALERT:
                await self._skip(idle, budget)
                return
            await self._alert(idle, budget)
        else:
            self.misses = 0
        await self._renew(budget)

    def _new_checkpoint(self) -> str | None:
        """The work's checkpoint if it changed since the last stored one (None: send none).
        One too large to store is left out, with a warning: the renewal matters more."""
        source = self.checkpoint
        current = source() if source is not None else None
        if current is None or current == self._stored_checkpoint:
            return None
        problem = checkpoint_problem(self.fence, current)
        if problem is not None:
            log.warning("%s", problem)
            return None
        return current

    async def _renew(self, budget: float) -> None:
        sent = self.clock()
        checkpoint = self._new_checkpoint()
        try:
            # Never let a hung renewal carry us past the self-fence point.
            async with asyncio.timeout(max(0.0, self.fence_at - sent)):
                answer = await self.store.renew(
                    self.fence,
                    ttl=self.timings.ttl,
                    stage=self.progress.stage,
                    progress_version=self.progress.version,
                    max_no_progress=budget,
                    grace=self.timings.renew_interval,
                    checkpoint=checkpoint,
                )
            answered_at = time.time()  # the renewal's own time: its log line may come later
        except (StoreUnavailable, TimeoutError) as exc:
            self._event("renew_failed", detail=str(exc) or "no answer before the self-fence point")
            return
        if not answer.ok:
            self._event("renew_refused", detail=answer.reason or "")
            if self._committing:  # the commit's answer decides (see the module docstring)
                return
            raise LeaseLost.refused(self.fence, answer.reason)
        self.self_fence.valid_until = sent + answer.lease_remaining
        if checkpoint is not None:
            self._stored_checkpoint = checkpoint
        moved = self.progress.version - self.reported_version
        self.reported_version = self.progress.version
        self._event("renewed", value=float(moved), at=answered_at)

    async def _skip(self, idle: float, budget: float) -> None:
        self.misses += 1
        self._event("renew_skipped", detail=f"no progress for {idle:.2f}s (budget {budget:g}s)")
        if self.misses < self.timings.stall_after_misses:
            return
        self.stalled_at = self.clock()
        try:
            async with asyncio.timeout(max(0.0, self.fence_at - self.clock())):
                await self._report(await self._stall_snapshot(idle, budget), idle, budget)
        except (StoreUnavailable, TimeoutError) as exc:  # the lease lapses anyway
            self._event("store_unavailable", detail=f"stall report: {exc or 'too late'}")
        self._event(
            "stalled", detail=f"{self.policy.value}: {_stall_text(self.progress, idle, budget)}"
        )
        raise Stalled(self.fence.key, self.progress.stage, idle, budget)

    async def _report(self, text: str, idle: float, budget: float) -> None:
        """Store the snapshot (expire) or step down with it (release)."""
        if self.policy is not StallPolicy.RELEASE:
            await self.store.report_stall(self.fence, self.progress.stage, text)
            return
        error = _stall_text(self.progress, idle, budget)
        await self.store.release(self.fence, error=error, snapshot=text)
        await due_now(self.store, self.fence.key)  # free at once for the workers too
        self._event("released", detail="stalled: stepped down")

    async def _alert(self, idle: float, budget: float) -> None:
        """Alert policy: record the stall once per episode, keep the lease."""
        if self.alerted_version == self.progress.version:
            return
        self.alerted_version = self.progress.version
        self._event("stalled", detail=f"alert: {_stall_text(self.progress, idle, budget)}")
        try:
            async with asyncio.timeout(max(0.0, self.fence_at - self.clock())):
                text = await self._stall_snapshot(idle, budget)
                await self.store.report_stall(self.fence, self.progress.stage, text)
        except (StoreUnavailable, TimeoutError) as exc:
            self._event("store_unavailable", detail=f"stall report: {exc or 'too late'}")

    async def _stall_snapshot(self, idle: float, budget: float) -> str:
        """The snapshot to store for a stall: the keeper's, as ``on_stall`` makes it."""
        text = self._snapshot(idle, budget)
        return text if self.on_stall is None else await self.on_stall(text, idle)

    def _snapshot(self, idle: float, budget: float) -> str:
        header = (
            f"{_stall_text(self.progress, idle, budget)}, progress version "
            f"{self.progress.version}, owner {self.fence.owner_id} token {self.fence.token}"
        )
        return snapshot(self.work, self.progress.thread_ident, header)

    def _event(
        self, kind: str, detail: str = "", value: float | None = None, at: float | None = None
    ) -> None:
        self._emit(
            Event(
                kind,
                self.fence.key,
                self.fence.owner_id,
                self.fence.token,
                self.progress.stage,
                self.progress.idle(),
                detail,
                at=time.time() if at is None else at,
                value=value,
            )
        )


def _stall_text(progress: Progress, idle: float, budget: float) -> str:
    return f"stage {progress.stage!r} made no progress for {idle:.2f}s (budget {budget:g}s)"


# -- the keeper beside the work -------------------------------------------------------------


class Renewals:
    """``keeper``'s task beside the current task (the work), owned by a task group:
    ``async with Renewals(keeper):`` around the work. The task starts when its first renewal
    (or the self-fence point) is due: a timer until then, so work shorter than one renew
    interval runs no extra task. If the keeper stops on its own (lease lost, stalled,
    self-fenced) its error is kept in ``failure`` and the work is stopped through an
    ``asyncio.timeout`` scope around it, which tells that cancellation apart from one that
    came from outside. Leaving raises the keeper's error in place of the work's own ending
    (its error is the cause), unless the work was also cancelled from outside: that wins."""

    def __init__(self, keeper: LeaseKeeper) -> None:
        self.keeper = keeper
        self.failure: list[BaseException] = []  # the keeper's error, once it stopped the work
        self.task: asyncio.Task[None] | None = None
        self._stopped = False
        self._group = asyncio.TaskGroup()  # the keeper's task's owner: leaving awaits it
        self._scope = asyncio.timeout(None)  # expired by the keeper to stop the work
        self._timer: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> Renewals:
        self.keeper.work = asyncio.current_task()
        await self._group.__aenter__()
        await self._scope.__aenter__()
        loop = asyncio.get_running_loop()
        # The keeper's clock and the loop's are both monotonic, possibly offset: convert.
        at = loop.time() + (self.keeper.first_wake() - self.keeper.clock())
        self._timer = loop.call_at(at, self._start)
        return self

    def _start(self) -> None:
        if not self._stopped:
            name = f"ai-lease keeper {self.keeper.fence.key}"
            self.task = self._group.create_task(self._keep(), name=name)

    async def _keep(self) -> None:
        """Run the keeper; when it stops by itself, keep why and stop the work."""
        try:
            await self.keeper.run()
        except asyncio.CancelledError:
            if self._stopped:
                raise
            # Only stop() cancels the keeper: a keeper that ended any other way (even by a
            # stray CancelledError) means nobody keeps the lease.
            fence = self.keeper.fence
            self.failure.append(LeaseLost(fence.key, "the lease keeper stopped", fence))
        except Exception as exc:
            self.failure.append(exc)
        if not self._scope.expired():
            self._scope.reschedule(-1.0)  # due already: the scope cancels the work

    def stop(self) -> None:
        """Stop renewing (the work is over): no keeper task starts, a running one is cancelled."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        try:
            await self._scope.__aexit__(exc_type, exc, tb)
        except TimeoutError:  # the scope's own: the keeper stopped the work, and only it
            raise self.failure[0] from None
        finally:
            await self._group.__aexit__(None, None, None)  # never leave the keeper running
        if self.failure and not isinstance(exc, asyncio.CancelledError):
            raise self.failure[0] from exc  # the work ended otherwise, the lease is gone
        return None  # as the work ended (a cancellation from outside goes on)

    def lost(self) -> BaseException | None:
        """Why the lease is gone, if it is: the keeper's error, or the self-fence's if the
        lease may have lapsed."""
        if self.failure:
            return self.failure[0]
        try:
            self.keeper.ensure_lease()
        except LeaseLost as exc:
            return exc
        return None


async def alongside(work: Awaitable[T], keeper: LeaseKeeper) -> T:
    """Run ``work`` in this task with ``keeper`` beside it; the first to fail stops the other.

    If the keeper fails (lease lost, stalled, self-fenced) it cancels this task and its
    error is raised here; a cancellation from outside (the job deadline, a shutdown) wins.
    Work that fails on its own while the lease is gone (after a stopped process wakes, a
    stream timeout and the self-fence are due together) fails for the lease, not for its
    own error: the keeper's error (or the self-fence) is raised, from the work's.
    """
    renewals = Renewals(keeper)
    async with renewals:
        try:
            return await work
        except Exception as exc:
            lost = None if renewals.failure else renewals.lost()
            if lost is not None:
                raise lost from exc
            raise
