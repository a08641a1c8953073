"""Each model call's ids in the job's timeline: a ``model_call`` entry per call.

A call sends a fresh UUID as ``X-Request-Id`` and the job's correlation
(``<key>:<token>:<n>``) as ``X-Client-Request-Id`` (:mod:`ai_lease.providers.request_ids`).
:func:`noting_call` writes both into the job's stored timeline (the store's
:meth:`~ai_lease.lease.timeline.JobNotes.note`), so ``ai-lease events KEY`` finds the id a
provider logged. The note is written *beside* the call, never before it (no round trip
delays the first token), and waited for when the call ends, at most :data:`CALL_NOTE_WAIT_S`;
a store without notes (a third-party one, an isolated job's child) is skipped, and a note
that fails is logged and dropped: it never fails the call. :func:`note_call` writes one
after the fact (a background response cancelled once given up), waited for the same way.
A call cancelled mid-way does not wait for its note: the note is left to the attempt's
:class:`CallNotes`, which the attempt closes at its end (every note task has an owner).

>>> call_detail(2, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "k:7:2", "ollama", "qwen3")
'call 2 · ollama qwen3 · request_id 1b4e28ba-2fa1-11d2-883f-0016d3cca427 · client_request_id k:7:2'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from ai_lease.lease.base import Fence

__all__ = ["CALL_NOTE_WAIT_S", "CallNotes", "call_detail", "note_call", "noting_call"]

CALL_NOTE_WAIT_S = 2.0
"""Seconds a call's end waits for its note to be written (then it is given up on)."""

_log = logging.getLogger("ai_lease.runner")


def call_detail(n: int, request_id: str, client_id: str, provider: str, model: str | None) -> str:
    """A ``model_call`` entry's detail: the call's number, provider, model and both ids."""
    name = f"{provider} {model}" if model else provider
    return f"call {n} · {name} · request_id {request_id} · client_request_id {client_id}"


class CallNotes:
    """The owner of the notes a cancelled call leaves unfinished: the attempt's
    (``ctx._run.notes``), which :meth:`close` s them when it ends — so no note task outlives
    the attempt that started it."""

    def __init__(self) -> None:
        self._left: set[asyncio.Task[object]] = set()

    def __len__(self) -> int:
        return len(self._left)

    def adopt(self, task: asyncio.Task[object], key: str) -> None:
        """Keep ``task`` (a cancelled call's note) until it finishes or :meth:`close`."""
        if task.done():
            _told(task, key)
            return
        self._left.add(task)

        def finished(done: asyncio.Task[object]) -> None:
            self._left.discard(done)
            _told(done, key)

        task.add_done_callback(finished)

    async def close(self, wait: float = CALL_NOTE_WAIT_S) -> None:
        """Wait at most ``wait`` seconds for the notes left, then cancel the rest and wait
        for them to unwind (a cancelled store call returns at once)."""
        left = set(self._left)
        if not left:
            return
        if wait > 0:
            await asyncio.wait(left, timeout=wait)
        for task in left:
            task.cancel()
        await asyncio.wait(left)
        self._left -= left


@contextlib.asynccontextmanager
async def noting_call(
    store: object, fence: Fence, stage: str | None, detail: str, owner: CallNotes
) -> AsyncIterator[None]:
    """Note ``detail`` as a ``model_call`` entry of ``fence``'s job while the block runs;
    a cancelled block leaves its note to ``owner`` (the attempt's)."""
    note = getattr(store, "note", None)
    if note is None:
        yield
        return
    task = asyncio.create_task(
        note(
            fence.key, "model_call", detail, owner_id=fence.owner_id, token=fence.token, stage=stage
        )
    )
    try:
        yield
    except Exception:
        await _settle(task, fence.key)
        raise
    except BaseException:  # cancelled: no await here; the attempt awaits it at its end
        owner.adopt(task, fence.key)
        raise
    await _settle(task, fence.key)


async def note_call(
    store: object, fence: Fence, stage: str | None, detail: str, owner: CallNotes
) -> None:
    """Note ``detail`` as a ``model_call`` entry of ``fence``'s job now, waiting for it at
    most :data:`CALL_NOTE_WAIT_S` (a store without notes: nothing)."""
    async with noting_call(store, fence, stage, detail, owner):
        pass


async def _settle(task: asyncio.Task[object], key: str) -> None:
    """Wait for the note at most :data:`CALL_NOTE_WAIT_S`; log (never raise) its failure."""
    if not task.done():
        await asyncio.wait({task}, timeout=CALL_NOTE_WAIT_S)
    if not task.done():
        task.cancel()
        _log.warning(
            "job %r: the model call's timeline note took over %g s: dropped", key, CALL_NOTE_WAIT_S
        )
        return
    _told(task, key)


def _told(task: asyncio.Task[object], key: str) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.warning("job %r: the model call's timeline note failed: %s", key, exc)
