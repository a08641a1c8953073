"""Stall snapshots: where a stuck task or thread is, innermost call last, bounded in size."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ai_lease.lease.snapshot import MAX_CHARS, MAX_FRAMES, snapshot


def functions(text: str) -> list[str]:
    """The function names in a snapshot's frame lines, in order."""
    return [line.rsplit(" in ", 1)[1] for line in text.splitlines() if line.startswith("  File ")]


async def started(coro: Any) -> asyncio.Task[Any]:
    task = asyncio.ensure_future(coro)
    for _ in range(5):  # let it run down to where it blocks
        await asyncio.sleep(0)
    return task


async def finish(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def stuck_innermost(future: asyncio.Future[None]) -> None:
    await future


async def stuck_middle(future: asyncio.Future[None]) -> None:
    await stuck_innermost(future)


async def stuck_outer(future: asyncio.Future[None]) -> None:
    await stuck_middle(future)


async def test_nested_coroutines_name_the_innermost_function_last() -> None:
    """A task blocked three coroutines deep lists outer, middle, innermost — innermost last."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(stuck_outer(future))
    try:
        text = snapshot(task, None, "job 'k' stalled")
    finally:
        await finish(task)
    assert text.splitlines()[0] == "job 'k' stalled"
    assert functions(text) == ["stuck_outer", "stuck_middle", "stuck_innermost"]
    assert __file__ in text


async def ticking(future: asyncio.Future[None]) -> AsyncIterator[int]:
    yield 1
    await stuck_innermost(future)
    yield 2


async def consume(future: asyncio.Future[None]) -> list[int]:
    return [i async for i in ticking(future)]


async def consume_with_async_for(future: asyncio.Future[None]) -> None:
    async for _ in ticking(future):
        pass


@pytest.mark.parametrize("consumer", [consume, consume_with_async_for])
async def test_async_generator_in_the_chain_is_followed(consumer: Any) -> None:
    """A task stuck inside an async generator it iterates names the generator and what it awaits."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(consumer(future))
    try:
        text = snapshot(task, None, "header")
    finally:
        await finish(task)
    names = functions(text)
    assert names[-2:] == ["ticking", "stuck_innermost"]
    assert names[0] in {"consume", "consume_with_async_for"}


async def nested(depth: int, future: asyncio.Future[None]) -> None:
    if depth == 0:
        await stuck_innermost(future)
    else:
        await nested(depth - 1, future)


async def test_deep_chain_keeps_the_innermost_frames() -> None:
    """A chain deeper than MAX_FRAMES is cut at the outer end: the stuck call is still named."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(nested(MAX_FRAMES + 20, future))
    try:
        text = snapshot(task, None, "header")
    finally:
        await finish(task)
    names = functions(text)
    assert len(names) <= MAX_FRAMES
    assert names[-1] == "stuck_innermost"


def blocked_in_sync_work(flag: list[bool]) -> None:
    while not flag:
        time.sleep(0.005)  # real: a real thread, blocked in sync work, is what is snapshotted


def calls_blocked(flag: list[bool]) -> None:
    blocked_in_sync_work(flag)


@pytest.fixture
def blocked_thread() -> Iterator[threading.Thread]:
    flag: list[bool] = []
    thread = threading.Thread(target=calls_blocked, args=(flag,), daemon=True)
    thread.start()
    time.sleep(0.05)  # real: a real thread, blocked in sync work, is what is snapshotted
    yield thread
    flag.append(True)
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_thread_blocked_in_a_sync_function_is_named(blocked_thread: threading.Thread) -> None:
    """A worker thread's stack ends with the sync function it is stuck in."""
    text = snapshot(None, blocked_thread.ident, "header")
    assert f"thread {blocked_thread.ident}" in text
    names = functions(text)
    assert names[-2:] == ["calls_blocked", "blocked_in_sync_work"]


async def test_task_and_thread_both_appear(blocked_thread: threading.Thread) -> None:
    """With a stuck task and a worker thread, the snapshot shows both, task first."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(stuck_outer(future))
    try:
        text = snapshot(task, blocked_thread.ident, "header")
    finally:
        await finish(task)
    coroutine_at = text.index("coroutine (innermost last):")
    thread_at = text.index(f"thread {blocked_thread.ident} (innermost last):")
    assert coroutine_at < text.index("stuck_innermost") < thread_at
    assert text.index("blocked_in_sync_work") > thread_at


async def test_finished_task_and_no_thread_give_only_the_header() -> None:
    """Nothing to show beyond the header when the task is done and no thread is running."""

    async def quick() -> None:
        return None

    task = asyncio.ensure_future(quick())
    await task
    assert snapshot(task, None, "just the header") == "just the header"
    assert snapshot(None, None, "h") == "h"


async def test_output_is_bounded_by_max_chars(blocked_thread: threading.Thread) -> None:
    """However long the header and stacks, the snapshot is at most MAX_CHARS characters."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = await started(nested(MAX_FRAMES * 3, future))
    try:
        text = snapshot(task, blocked_thread.ident, "h" * (MAX_CHARS * 2))
    finally:
        await finish(task)
    assert len(text) <= MAX_CHARS
    short = snapshot(None, None, "x" * MAX_CHARS)
    assert len(short) == MAX_CHARS
