"""The lease keeper: the owner's heartbeat, which renews only while the job makes progress.

Every ``renew_interval`` it compares the time since the last real progress (monotonic
clock) with the current stage's ``max_no_progress``:

* within budget: renew, sending stage, budget and progress version (the store checks too);
* over budget: skip the renewal; after ``stall_after_misses`` skips the job has **stalled**:
  a snapshot of where the work is stuck goes into the job record, and the stall policy
  decides: ``expire`` (let the lease lapse), ``release`` (step down at once) — both raise
  :class:`Stalled`, cancelling the work — or ``alert`` (keep renewing, record and count);
* renewal refused (lease lost, newer token): raise :class:`LeaseLost` at once;
* store unreachable: keep trying, and raise :class:`LeaseLost` before the lease could have
  lapsed (``self_fence_margin`` ahead, on the local monotonic clock, counted from when the
  last successful renewal was *sent*): the owner fences itself.

It runs beside the work, started only when its first renewal is due (most short jobs end
before: they never pay for a task); raising is how it stops the work.
"""

from __future__ import annotations

import asyncio
from typing import Any, NoReturn

from ai_lease.errors import LeaseLost, Stalled, StoreUnavailable
from ai_lease.lease.base import Fence, LeaseStore, due_now
from ai_lease.observe.events import Event, EventSink
from ai_lease.observe.snapshot import snapshot
from ai_lease.run.progress import Progress
from ai_lease.timeouts import LeaseTimings, StallPolicy

__all__ = ["LeaseKeeper"]


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
    ) -> None:
        self.store, self.fence, self.progress, self.timings = store, fence, progress, timings
        self.clock = progress.clock
        self.valid_until = valid_until  # local monotonic time the lease surely lasts until
        self.policy = StallPolicy(stall_policy or timings.stall_policy)
        self.misses = 0
        self.stalled_at: float | None = None  # local monotonic time of the stall, if any
        self.reported_version = progress.version  # progress counted into "renewed" events
        self.alerted_version: int | None = None
        self.work: asyncio.Task[Any] | None = None  # the task to snapshot when stalled
        self.started_at = self.clock()  # renewals are due every renew_interval from here
        self._emit = on_event or (lambda event: None)

    # -- local checks (cheap; used by the pipeline before any side effect) ---------------------

    @property
    def fence_at(self) -> float:
        """Local monotonic time at which the owner must stop working without a renewal."""
        return self.valid_until - self.timings.self_fence_margin

    def ensure_lease(self) -> None:
        """Raise :class:`LeaseLost` if the lease may have lapsed (e.g. the loop was blocked)."""
        late = self.clock() - self.fence_at
        if late >= 0:
            self._event("self_fenced", detail=f"{late:.2f}s past the self-fence point")
            raise LeaseLost(
                self.fence.key,
                f"no renewal landed in time (self-fenced {late:.2f}s past the safe point): "
                "work stopped before the lease could lapse",
                self.fence,
            )

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

    async def _renew(self, budget: float) -> None:
        sent = self.clock()
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
                )
        except (StoreUnavailable, TimeoutError) as exc:
            self._event("renew_failed", detail=str(exc) or "no answer before the self-fence point")
            return
        if not answer.ok:
            self._event("renew_refused", detail=answer.reason or "")
            raise LeaseLost.refused(self.fence, answer.reason)
        self.valid_until = sent + answer.lease_remaining
        moved = self.progress.version - self.reported_version
        self.reported_version = self.progress.version
        self._event("renewed", value=float(moved))

    async def _skip(self, idle: float, budget: float) -> None:
        self.misses += 1
        self._event("renew_skipped", detail=f"no progress for {idle:.2f}s (budget {budget:g}s)")
        if self.misses < self.timings.stall_after_misses:
            return
        self.stalled_at = self.clock()
        text = self._snapshot(idle, budget)
        try:
            async with asyncio.timeout(max(0.0, self.fence_at - self.clock())):
                await self._report(text, idle, budget)
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
                await self.store.report_stall(
                    self.fence, self.progress.stage, self._snapshot(idle, budget)
                )
        except (StoreUnavailable, TimeoutError) as exc:
            self._event("store_unavailable", detail=f"stall report: {exc or 'too late'}")

    def _snapshot(self, idle: float, budget: float) -> str:
        header = (
            f"{_stall_text(self.progress, idle, budget)}, progress version "
            f"{self.progress.version}, owner {self.fence.owner_id} token {self.fence.token}"
        )
        return snapshot(self.work, self.progress.thread_ident, header)

    def _event(self, kind: str, detail: str = "", value: float | None = None) -> None:
        self._emit(
            Event(
                kind,
                self.fence.key,
                self.fence.owner_id,
                self.fence.token,
                self.progress.stage,
                self.progress.idle(),
                detail,
                value=value,
            )
        )


def _stall_text(progress: Progress, idle: float, budget: float) -> str:
    return f"stage {progress.stage!r} made no progress for {idle:.2f}s (budget {budget:g}s)"
