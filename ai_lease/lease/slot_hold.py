"""Holding a provider slot around your own code: wait in line, renew, give it back.

>>> async with client.slot("openai:gpt-4o-mini", capacity=4, max_wait=30) as held:  # doctest: +SKIP
...     answer = await my_model_call()

**Entering** asks the store for one of the limit's ``capacity`` slots; while all are taken
(or others wait before it) it waits its turn, first come first served, woken by releases and
asking again at least every ``wait_ttl / 3`` (its place in line lapses if it stops asking).
After ``max_wait`` seconds without a slot it gives up its place and raises
:class:`~ai_lease.lease.slots.SlotWaitTimeout` naming the limit and how long it waited.

**While the block runs** a task beside it renews the slot's lease every ``ttl / 3``. A
renewal the store refuses (the lease lapsed: this process was stopped, say), or no renewal
landing before ``ttl - ttl / 6`` after the last good one was sent (the store unreachable),
**cancels the block** and it raises :class:`~ai_lease.lease.slots.SlotLost`: work that lost
its slot stops before another holder could be given it. A cancellation from outside wins.
With a ``stuck`` hook (the runner's: did the job make progress within its stage's budget?)
each renewal asks it first, and a stuck holder gives the slot back at once and raises
:class:`~ai_lease.lease.slots.SlotStopped`; ``renew_every`` (at most ``ttl / 3``) is then
how soon that is seen. ``on_wait(ahead)`` is called after each ask that found no slot
(``paused`` then says how long the limit stays paused).

**A 429 with a retry hint** in your block: ``await held.pause(seconds)`` pauses the whole
limit for every process on the store (nobody is granted a slot until then), not only you.

**Leaving** releases the slot (fenced: a slot lost meanwhile is left alone) and wakes the
next waiter; a release the store does not answer is sent again while the slot's lease lasts.
Sync code in the block blocks the renewals too: run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Self

from ai_lease.errors import StoreError
from ai_lease.lease.slots import (
    WAIT_TTL,
    SlotFence,
    SlotGrant,
    SlotLost,
    SlotStopped,
    SlotStore,
    SlotWaitTimeout,
    check_seconds,
    check_slot_args,
)
from ai_lease.retry import RetryPolicy, resend

__all__ = ["MAX_WAIT_RANGE", "SlotHold", "Stuck"]

log = logging.getLogger("ai_lease.slots")

_RELEASING: set[asyncio.Future[None]] = set()
"""Releases still being sent after the task giving the slot back was cancelled."""

RELEASE_RESEND = RetryPolicy(attempts=8, initial=0.05, multiplier=2.0, max_backoff=0.4)
"""Resends of a release the store did not answer (0.05 s, 0.1 s … 0.4 s apart), as long as
the slot's lease lasts: given back at once, the next waiter need not wait out the lease."""

MAX_WAIT_RANGE = (0.0, 86_400.0)
"""The ``max_wait`` a caller may ask for (seconds)."""

Stuck = Callable[[], tuple[str, float] | None]
"""Asked before each renewal: why the holder's work is stuck and the budget it broke, or
None. A stuck holder gives its slot back at once (:class:`SlotStopped`), so a zombie
cannot keep it: the runner asks whether the job made progress within its stage's budget."""


class SlotHold:
    """The handle ``client.slot(limit, ...)`` gives (see the module docstring): ``fence``
    is the slot held (None outside the block), ``waited`` how long entering waited."""

    def __init__(
        self,
        store: SlotStore,
        limit: str,
        owner_id: str,
        *,
        capacity: int,
        ttl: float = 30.0,
        max_wait: float = 60.0,
        priority: int = 0,
        wait_ttl: float = WAIT_TTL,
        renew_every: float | None = None,
        stuck: Stuck | None = None,
        on_wait: Callable[[int], None] | None = None,
        weight: int | None = None,
    ) -> None:
        self.limit = check_slot_args(
            limit, capacity=capacity, ttl=ttl, priority=priority, wait_ttl=wait_ttl, weight=weight
        )
        # units of a weighted limit (a tpm window's tokens); asked for only when given, so a
        # store written before weights still takes the rest
        self._weight = {} if weight is None else {"weight": weight}
        self.max_wait = check_seconds(limit, "max_wait", max_wait, *MAX_WAIT_RANGE)
        self.store, self.owner_id, self.capacity = store, owner_id, capacity
        self.ttl, self.priority, self.wait_ttl = float(ttl), priority, float(wait_ttl)
        self.renew_every = min(self.ttl / 3, renew_every or self.ttl / 3)
        self.stuck, self.on_wait = stuck, on_wait
        self.fence: SlotFence | None = None
        self.waited = 0.0
        self.paused = 0.0  # after an ask that found no slot: seconds the limit stays paused
        self._failure: SlotLost | SlotStopped | None = None
        self._group: asyncio.TaskGroup | None = None
        self._scope = asyncio.timeout(None)  # expired by the renewals to stop the block
        self._keeper: asyncio.Task[None] | None = None
        self._lapse_at = 0.0  # loop time by which the slot's lease surely ends unrenewed

    # -- entering: wait in line ------------------------------------------------------------

    async def __aenter__(self) -> Self:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            grant, sent = await self._take(started)
        except BaseException:
            await self._leave()
            raise
        self.fence, self.waited = grant.fence, loop.time() - started
        self._lapse_at = sent + self.ttl
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        await self._scope.__aenter__()
        name = f"ai-lease slot {self.limit}"
        self._keeper = self._group.create_task(self._keep(grant.fence, sent), name=name)
        return self

    async def _take(self, started: float) -> tuple[SlotGrant, float]:
        """Ask until granted (the grant, and when the granting ask was sent: loop time);
        between asks, wait for a release or a third of ``wait_ttl``, whichever is first."""
        loop = asyncio.get_running_loop()
        deadline, ahead = started + self.max_wait, 0
        while True:
            sent = loop.time()
            try:
                outcome = await self.store.acquire_slot(
                    self.limit,
                    self.owner_id,
                    capacity=self.capacity,
                    ttl=self.ttl,
                    priority=self.priority,
                    wait_ttl=self.wait_ttl,
                    **self._weight,
                )
            except StoreError:
                if loop.time() >= deadline:
                    raise
                outcome = None  # asking again is safe: a grant whose reply was lost comes back
            if isinstance(outcome, SlotGrant):
                return outcome, sent
            if outcome is not None:
                self.paused = outcome.paused
                if self.on_wait is not None:
                    self.on_wait(outcome.ahead)
            ahead = outcome.ahead if outcome is not None else ahead
            left = deadline - loop.time()
            if left <= 0:
                raise SlotWaitTimeout(self.limit, loop.time() - started, self.max_wait, ahead)
            # Paused: ask again as it ends (or sooner, to keep the place in line).
            await self._pause(min(left, self.wait_ttl / 3, self.paused or left), ahead)

    async def _pause(self, timeout: float, ahead: int) -> None:
        """Until the limit's next release, or ``timeout`` (slept out if the store fails)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        try:
            await self.store.wait_slot(self.limit, timeout, ahead=ahead)
        except StoreError:
            await asyncio.sleep(max(0.0, until - loop.time()))

    async def _leave(self) -> None:
        """Give up the place in line (and a slot granted with its reply lost): best effort,
        the entry lapses by itself after ``wait_ttl`` anyway."""
        with contextlib.suppress(StoreError):
            await self.store.leave_slot(self.limit, self.owner_id)

    async def pause(self, seconds: float) -> float:
        """Grant no slot of this limit to anyone for ``seconds`` (a provider's 429 asked to
        wait that long): the seconds the pause now lasts (a later end already set is kept)."""
        return await self.store.pause_slot(self.limit, seconds)

    async def take(self) -> SlotGrant:
        """Wait in line as entering does, and take a slot without holding it: it is never
        renewed nor given back, and lapses ``ttl`` after it was granted (one request's place
        in a rate window: ``rpm`` slots of a minute). ``waited`` is set."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            grant, _ = await self._take(started)
        except BaseException:
            await self._leave()
            raise
        self.waited = loop.time() - started
        return grant

    # -- while the block runs: renew ----------------------------------------------------------

    async def _keep(self, fence: SlotFence, sent: float) -> None:
        """Renew every ``ttl / 3`` from the last good renewal's send; stop the block when one
        is refused or none landed by the self-fence point (``ttl / 6`` before the lapse)."""
        try:
            await self._renew_until_lost(fence, sent)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a renewal that failed in an unexpected way: stop too
            self._failure = SlotLost(fence, f"the renewals failed ({type(exc).__name__}: {exc})")
        if not self._scope.expired():
            self._scope.reschedule(-1.0)  # due already: the scope cancels the block

    async def _renew_until_lost(self, fence: SlotFence, sent: float) -> None:
        loop = asyncio.get_running_loop()
        interval = self.renew_every
        while True:
            fence_at = sent + self.ttl - self.ttl / 6
            await asyncio.sleep(max(0.0, sent + interval - loop.time()))
            if self.stuck is not None and (why := self.stuck()) is not None:
                self._failure = SlotStopped(fence.limit, *why)
                return
            while True:
                attempt = loop.time()
                try:
                    async with asyncio.timeout_at(fence_at):
                        ok = await self.store.renew_slot(fence, self.ttl)
                    break
                except (StoreError, TimeoutError) as exc:
                    if loop.time() >= fence_at:
                        reason = f"no renewal landed in time (last error: {exc})"
                        self._failure = SlotLost(fence, reason)
                        return
                    await asyncio.sleep(min(interval / 4, max(0.0, fence_at - loop.time())))
            if not ok:
                reason = "renewal refused: the store no longer holds it for this owner (lapsed)"
                self._failure = SlotLost(fence, reason)
                return
            sent = attempt
            self._lapse_at = sent + self.ttl

    # -- leaving: give it back ------------------------------------------------------------------

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._keeper is not None and not self._keeper.done():
            self._keeper.cancel()
        try:
            await self._scope.__aexit__(exc_type, exc, tb)
        except TimeoutError:  # the scope's own: the renewals stopped the block, and only they
            assert self._failure is not None
            raise self._failure from None
        finally:
            if self._group is not None:
                await self._group.__aexit__(None, None, None)
            await self._give_back()
        if self._failure is not None and not isinstance(exc, asyncio.CancelledError):
            raise self._failure from exc

    async def _give_back(self) -> None:
        """Release the slot. A cancellation that comes meanwhile (a stalled job is stopped,
        then its runner is) does not stop the release: it goes on in its own task, bounded
        by the slot's lapse, while the cancellation goes on here."""
        fence, self.fence = self.fence, None
        if fence is None or isinstance(self._failure, SlotLost):
            return  # lost: not ours to release
        release = asyncio.ensure_future(self._release(fence))
        try:
            await asyncio.shield(release)
        except asyncio.CancelledError:
            _RELEASING.add(release)  # kept until it ends
            release.add_done_callback(_RELEASING.discard)
            raise

    async def _release(self, fence: SlotFence) -> None:
        loop = asyncio.get_running_loop()
        try:
            await resend(
                lambda: self.store.release_slot(fence),
                RELEASE_RESEND,
                StoreError,
                until=lambda: loop.time() >= self._lapse_at,
            )
        except StoreError as exc:  # its lease lapses by itself within ttl
            log.warning("slot %s not released (%s): it lapses within %gs", fence, exc, self.ttl)

    def __repr__(self) -> str:
        held = f"holding {self.fence}" if self.fence else "not held"
        return f"<SlotHold {self.limit!r} capacity={self.capacity} {held}>"
