"""Fencing: every write an owner makes is fenced on its ``(token, owner)`` pair.

The protocol, in one place:

* **one fence per attempt** — each attempt owns the job under an owner id of its own
  (:func:`new_owner_id`: ``<node_id>#<n>.<random>``), so two attempts never share a fence,
  and the store hands out a higher token on every acquisition;
* **the self-fence** — an owner stops before its lease could have lapsed
  (:class:`SelfFence`: ``self_fence_margin`` ahead of the lease's end, local monotonic
  clock, counted from when the last successful renewal was *sent*); the keeper checks it
  on every wake, the pipeline before every side effect;
* **the fenced commit** (:func:`fenced_commit`) — the store writes the one result only
  while the pair still holds the lease; a commit repeated after a lost reply returns the
  same record, so a commit that failed unapplied (connection refused) or with an unknown
  outcome (a reset, a lost reply) is resent while the lease is valid — the finished answer
  is never thrown away while its owner could still store it — and a stale owner's write is
  refused with :class:`FencingRejected` (:func:`fenced_event` says so). Once the lease may
  have lapsed the commit stops with :class:`LeaseLost`: nothing is released, so the answer
  reaches the next owner only through the record (if one of the sends landed);
* **an unknown outcome** — an attempt that ended without its commit's answer
  (:class:`OutcomeUnknown`, or any store error) is remembered (:class:`UnansweredCommits`):
  if the job turns out DONE under that very fence, the commit was applied after all.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from ai_lease.errors import FencingRejected, LeaseLost, StoreUnavailable
from ai_lease.job import JobState, RunFacts
from ai_lease.lease.base import Fence, LeaseStore
from ai_lease.lease.events import Event
from ai_lease.retry import COMMIT_RESEND, RetryPolicy, resend

__all__ = [
    "SelfFence",
    "UnansweredCommits",
    "default_node_id",
    "fenced_commit",
    "fenced_event",
    "new_owner_id",
]

_attempts = itertools.count(1)

COMMIT_WHILE_VALID = RetryPolicy(attempts=2, initial=0.05, multiplier=2.0, max_backoff=0.4)
"""The waits between resends of a commit bounded by its lease (0.05 s, 0.1 s … 0.4 s):
as many sends as the lease's remaining validity allows (``attempts`` is not used)."""


def default_node_id() -> str:
    """This node's name in records and logs: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def new_owner_id(node_id: str) -> str:
    """A fresh owner id for one attempt on ``node_id``: ``<node_id>#<n>.<random>``."""
    return f"{node_id}#{next(_attempts)}.{secrets.token_hex(2)}"


class SelfFence:
    """When an owner must stop working without a renewal: ``margin`` before ``valid_until``
    (both on ``clock``, the local monotonic clock)."""

    def __init__(
        self, fence: Fence, valid_until: float, margin: float, clock: Callable[[], float]
    ) -> None:
        self.fence, self.valid_until, self.margin, self.clock = fence, valid_until, margin, clock

    @property
    def fence_at(self) -> float:
        """Local monotonic time at which the owner must stop working without a renewal."""
        return self.valid_until - self.margin

    def overdue(self) -> float:
        """Seconds past the self-fence point (negative: still safe)."""
        return self.clock() - (self.valid_until - self.margin)  # fence_at, on the hot path

    def lost(self, late: float) -> LeaseLost:
        """The error of an owner ``late`` seconds past its self-fence point."""
        return LeaseLost(
            self.fence.key,
            f"no renewal landed in time (self-fenced {late:.2f}s past the safe point): "
            "work stopped before the lease could lapse",
            self.fence,
        )


async def fenced_commit(
    store: LeaseStore,
    fence: Fence,
    blob: str,
    *,
    finish_reason: str | None = None,
    facts: RunFacts | None = None,
    after: Callable[[JobState], Awaitable[None]] | None = None,
    valid_until: Callable[[], float] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> JobState:
    """Write ``blob`` as the job's one result under ``fence``; resend after a store error
    (the store answers a repeated commit with the same record). ``after`` sees the stored
    record before it is returned. Raises :class:`FencingRejected` for a stale owner.

    ``valid_until()`` (on ``clock``): until when the lease surely lasts. With it, the
    commit is resent as long as a send can start before then, and :class:`LeaseLost`
    (from the last store error) is raised once none can; without it, the
    :data:`~ai_lease.retry.COMMIT_RESEND` sends are made and the last
    :class:`StoreUnavailable` is raised."""

    async def send() -> JobState:
        committed = await store.commit(fence, blob, finish_reason=finish_reason, facts=facts)
        if after is not None:
            await after(committed)
        return committed

    if valid_until is None:
        return await resend(send, COMMIT_RESEND, StoreUnavailable)
    try:
        return await send()  # nearly always lands: no retry machinery on the way
    except StoreUnavailable as exc:
        first = exc
    try:
        return await _resend_while_valid(send, first, valid_until, clock)
    except StoreUnavailable as exc:
        raise _unanswered(fence, exc) from exc


async def _resend_while_valid(
    send: Callable[[], Awaitable[JobState]],
    first: StoreUnavailable,
    valid_until: Callable[[], float],
    clock: Callable[[], float],
) -> JobState:
    """Resend after ``first``, each time the wait ends before ``valid_until()``."""

    def lease_over(state: RetryCallState) -> bool:
        return clock() + state.upcoming_sleep >= valid_until()

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(StoreUnavailable),
        wait=COMMIT_WHILE_VALID.wait(),
        stop=lease_over,
        sleep=asyncio.sleep,
        reraise=True,
    )
    replayed = False

    async def again() -> JobState:
        nonlocal replayed
        if not replayed:  # the first failure counts, so waits start at the first one
            replayed = True
            raise first
        return await send()

    return await retrying(again)


def _unanswered(fence: Fence, exc: StoreUnavailable) -> LeaseLost:
    return LeaseLost(
        fence.key,
        f"the commit got no answer while the lease was valid ({exc}); its outcome is unknown "
        "and the lease may have lapsed: the job's record decides (the runner looks again)",
        fence,
    )


def fenced_event(fence: Fence, exc: FencingRejected) -> Event:
    """The ``fenced`` event of an owner whose write the store refused."""
    return Event(
        "fenced",
        fence.key,
        fence.owner_id,
        fence.token,
        None,
        None,
        str(exc),
        attrs={"reason": exc.code},
    )


class UnansweredCommits:
    """Fences of attempts that ended without their commit's answer (at most ``limit``,
    the oldest forgotten first): if the job turns out DONE under one of them, that commit
    was applied after all."""

    def __init__(self, limit: int = 1024) -> None:
        self.limit = limit
        self._fences: dict[Fence, None] = {}

    def expect(self, fence: Fence) -> None:
        """``fence``'s attempt has started: its commit has no answer yet."""
        self._fences[fence] = None
        if len(self._fences) > self.limit:
            del self._fences[next(iter(self._fences))]

    def answered(self, fence: Fence) -> None:
        """``fence``'s attempt got its commit's answer."""
        self._fences.pop(fence, None)

    def applied_late(self, record: JobState) -> bool:
        """Whether DONE ``record`` was written by a commit whose answer we never had."""
        return self._fences.pop(Fence.of(record), ()) is None
