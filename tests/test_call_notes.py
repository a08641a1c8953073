"""A model call's timeline note has an owner: a cancelled call leaves its note to the
attempt's CallNotes, which waits for it (bounded) or cancels it when the attempt ends."""

from __future__ import annotations

import asyncio
from typing import Any

from ai_lease.lease.base import Fence
from ai_lease.run.call_notes import CallNotes, noting_call

FENCE = Fence("k", "owner", 7)


class SlowNotes:
    """A store whose note takes ``delay`` seconds (virtual: the test's own events)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.written: list[str] = []
        self.cancelled = 0

    async def note(self, key: str, kind: str, detail: str, **_: Any) -> None:
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.written.append(detail)


async def _cancelled_call(store: SlowNotes, owner: CallNotes) -> None:
    entered = asyncio.Event()

    async def call() -> None:
        async with noting_call(store, FENCE, "call_ai", "call 1", owner):
            entered.set()
            await asyncio.Event().wait()  # the model call, never answering

    task = asyncio.create_task(call())
    await entered.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def test_a_cancelled_calls_note_is_owned_and_finished_at_close() -> None:
    store, owner = SlowNotes(), CallNotes()
    await _cancelled_call(store, owner)
    assert len(owner) == 1  # not awaited by the cancelled call: held by its owner
    store.release.set()
    await owner.close()
    assert store.written == ["call 1"] and len(owner) == 0


async def test_closing_without_waiting_cancels_what_is_left() -> None:
    """The attempt's cancellation path waits for nothing beyond its step-down."""
    store, owner = SlowNotes(), CallNotes()
    await _cancelled_call(store, owner)
    await owner.close(wait=0.0)
    assert store.written == [] and store.cancelled == 1 and len(owner) == 0


async def test_a_note_that_outlasts_the_wait_is_cancelled() -> None:
    store, owner = SlowNotes(), CallNotes()
    await _cancelled_call(store, owner)
    await owner.close(wait=0.01)
    assert store.cancelled == 1 and len(owner) == 0


async def test_a_call_that_ends_waits_for_its_own_note() -> None:
    store, owner = SlowNotes(), CallNotes()
    store.release.set()
    async with noting_call(store, FENCE, None, "call 2", owner):
        pass
    assert store.written == ["call 2"] and len(owner) == 0
