"""How an owned attempt ends without a commit: the one release / fail path.

Both owners of a lease go through here: a runner's :class:`~ai_lease.run.attempt.Attempt`
and :class:`~ai_lease.run.job_lease.JobLease` (``client.lease(key)``, your own code). So the
same case ends the same way, and raises the same exception, from both:

* **cancelled from outside** (Ctrl-C, a shutdown) — :meth:`Ending.step_down`: the lease is
  handed back, the attempt uncounted, and ``CancelledError`` goes on;
* **a retryable error** — :meth:`Ending.failed` releases with the (redacted) error, counted
  by the store (which ends the job FAILED at the next acquire after the retry policy's last
  attempt); the caller decides what follows (the runner retries after the backoff, a
  ``JobLease`` re-raises the error);
* **bad input or a non-retryable error** — :meth:`Ending.failed` ends the job FAILED with the
  error's :class:`~ai_lease.failure.FailureKind` and raises :class:`JobFailed` from it;
* **the lease is not ours any more** (lost, stalled, fenced off) — nothing is written here.

Every write is bounded by twice the store's op timeout; a store that does not answer, or
that no longer holds this lease, is said as an event and the lease lapses on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ai_lease.errors import FencingRejected, JobFailed, LeaseError, StoreUnavailable
from ai_lease.failure import FailureKind, kind_of
from ai_lease.job import RunFacts
from ai_lease.lease.base import Fence, LeaseStore
from ai_lease.lease.classify import describe, retryable
from ai_lease.lease.events import Event, EventSink
from ai_lease.lease.fence import fenced_event
from ai_lease.lease.queue import due_now
from ai_lease.redaction import redact

__all__ = ["Ending"]


class Ending:
    """The end of ``fence``'s attempt on ``store``: see the module docstring. ``emit``
    takes the events it says (None: none); ``facts`` gives what ran, recorded on a FAILED
    job (an empty dict: nothing ran)."""

    def __init__(
        self,
        store: LeaseStore,
        fence: Fence,
        op_timeout: float,
        emit: EventSink | None = None,
        facts: Callable[[], dict[str, Any]] = dict,
    ) -> None:
        self.store, self.fence, self.emit, self.facts = store, fence, emit, facts
        self.bound = op_timeout * 2

    def _say(
        self, what: str, detail: str, attrs: dict[str, float | int | str] | None = None
    ) -> None:
        if self.emit is not None:
            fence = self.fence
            self.emit(
                Event(what, fence.key, fence.owner_id, fence.token, detail=detail, attrs=attrs)
            )

    async def step_down(self) -> None:
        """Hand the lease back after a cancellation: not the job's failure, uncounted."""
        fence, store = self.fence, self.store
        try:
            async with asyncio.timeout(self.bound):
                await store.release(fence, interrupted=True)
                await due_now(store, fence.key)
            self._say("released", "cancelled: stepped down", {"reason": "interrupted"})
        except (StoreUnavailable, TimeoutError, LeaseError) as exc:
            self._say("store_unavailable", f"could not step down: {exc}")

    async def release(self, error: str) -> None:
        """Hand the lease back with ``error`` (a failed attempt, counted by the store)."""
        fence, store = self.fence, self.store
        error = redact(error)  # stored: no secret leaves the process in a record
        try:
            async with asyncio.timeout(self.bound):
                released = await store.release(fence, error=error)
                await due_now(store, fence.key)
            # The event says what the store did: a lease no longer ours was not released.
            note = "" if released else " (not released: the store no longer held this lease)"
            self._say("released", error + note)
        except (StoreUnavailable, TimeoutError, LeaseError) as exc:  # it lapses on its own
            self._say("store_unavailable", str(exc) or type(exc).__name__)

    async def fail(self, reason: str, kind: FailureKind) -> None:
        """End the job FAILED with ``reason`` and ``kind`` (fenced: a stale owner's verdict
        is refused, and said)."""
        fence, reason, ran = self.fence, redact(reason), self.facts()
        try:
            async with asyncio.timeout(self.bound):
                if ran:  # what ran, when anything did
                    await self.store.fail(fence, reason, kind=kind, facts=RunFacts(**ran))
                else:
                    await self.store.fail(fence, reason, kind=kind)
            self._say("failed", reason, {"kind": kind.value})  # kind: the job_failed_total label
        except FencingRejected as exc:
            if self.emit is not None:
                self.emit(fenced_event(fence, exc))
        except (StoreUnavailable, TimeoutError, LeaseError) as exc:  # the next attempt says it
            self._say("store_unavailable", str(exc) or type(exc).__name__)

    async def failed(self, exc: Exception) -> None:
        """The attempt's own error: release it (retryable), or fail the job and raise
        :class:`JobFailed` from ``exc`` (bad input, a non-retryable error)."""
        if retryable(exc):
            await self.release(describe(exc))
            return
        reason, kind = describe(exc), kind_of(exc)
        await self.fail(reason, kind)
        raise JobFailed(self.fence.key, reason, kind) from exc
