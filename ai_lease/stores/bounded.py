"""The bounded wait the network stores share (Redis and PostgreSQL).

A call that outlives its caller's deadline is not cancelled: the caller gets its
``TimeoutError`` and the call runs on as a task of its own, reads its late reply and hands its
connection back to the pool, so that a slow link does not cost a fresh connection on every
call (stores/redis/wire.py says why). :class:`Tasks` keeps those calls, so that closing a
store ends them. Neither store's client library is imported here: a PostgreSQL command does
not pay for redis-py's import, nor the other way round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["Tasks", "within"]

T = TypeVar("T")


async def within(task: asyncio.Task[T], timeout: float) -> T:
    """The task's result, or :class:`TimeoutError` after ``timeout`` seconds **without**
    cancelling it: the command goes on and reads its reply (see the module docstring).
    A caller cancelled meanwhile leaves the task running too."""
    if task.done():
        return task.result()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        raise TimeoutError
    return task.result()


class Tasks:
    """The commands still running after their caller's deadline, and the pool's re-warming:
    kept here so that :meth:`aclose` ends them (nothing left running behind a closed store)."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False

    def start(
        self, call: Awaitable[T], on_failure: Callable[[BaseException], None] | None = None
    ) -> asyncio.Task[T]:
        if self._closed and asyncio.iscoroutine(call):  # e.g. a re-warm after aclose
            call.close()
            call = asyncio.sleep(0, None)  # type: ignore[arg-type]
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        self._running.add(task)
        task.add_done_callback(lambda t: self._settle(t, on_failure))
        return task

    def _settle(
        self, task: asyncio.Task[Any], on_failure: Callable[[BaseException], None] | None
    ) -> None:
        self._running.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # consumed here, whether or not its caller still waits
        if error is not None and on_failure is not None:
            on_failure(error)

    async def aclose(self) -> None:
        self._closed = True
        running, self._running = list(self._running), set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
