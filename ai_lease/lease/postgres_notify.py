"""Followers of the PostgreSQL store wake on LISTEN/NOTIFY: one listening connection per store.

The functions that end a lease or a job NOTIFY the namespace's channel with the job's key as
the payload, in their own transaction (delivered when it commits). A store object keeps one
connection LISTENing on that channel and a table of key -> waiting futures: a thousand
followers cost one connection, not a thousand. When the listener cannot connect, or its
connection drops, every waiter is woken (a follower that wakes early just asks again) and
waits fall back to polling the record every ``poll_interval`` until the listener is back;
it is tried again at most once per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from ai_lease.errors import StoreError
from ai_lease.lease.postgres_schema import notify_payload

__all__ = ["Listener"]

log = logging.getLogger("ai_lease.store")

_RETRY_AFTER = 1.0  # seconds between attempts to bring a failed listener back


class Listener:
    """The LISTEN connection of one store and the futures waiting on its keys.

    ``connect`` opens the connection (autocommit, typed errors); ``changed`` polls one
    key's record version (for the fallback).
    """

    def __init__(
        self,
        channel: str,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        changed: Callable[[str], Awaitable[Any]],
        *,
        poll_interval: float,
        ready_timeout: float,
    ) -> None:
        self._channel, self._connect, self._version = channel, connect, changed
        self._poll, self._ready_timeout = poll_interval, ready_timeout
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._failed_at: float | None = None
        self._closed = False

    async def wait(self, key: str, timeout: float) -> None:
        """Return on the key's next NOTIFY, or after ``timeout`` seconds (polling when
        LISTEN is unavailable)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        woken: asyncio.Future[None] = loop.create_future()
        heard_as = notify_payload(key)
        self._waiters.setdefault(heard_as, set()).add(woken)
        try:
            if await self._listening(min(timeout, self._ready_timeout)):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        await woken
                return
            await self._poll_until(key, deadline, woken)
        finally:
            waiting = self._waiters.get(heard_as)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiters[heard_as]

    async def _listening(self, timeout: float) -> bool:
        """Whether the listener is up (started if need be, waited for up to ``timeout``)."""
        if self._ready.is_set():
            return True
        if self._closed:
            return False
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            if self._failed_at is not None and loop.time() - self._failed_at < _RETRY_AFTER:
                return False
            self._task = loop.create_task(self._listen(), name=f"ai-lease-listen:{self._channel}")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        return self._ready.is_set()

    async def _poll_until(self, key: str, deadline: float, woken: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        try:
            first = await self._version(key)
        except StoreError:
            first = None
        while (left := deadline - loop.time()) > 0 and not woken.done():
            await asyncio.sleep(min(self._poll, left))
            try:
                if await self._version(key) != first:
                    return
            except StoreError:
                continue

    async def _listen(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._connect()
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._ready.set()
            self._failed_at = None
            async for notice in conn.notifies():
                for woken in self._waiters.get(notice.payload, ()):
                    if not woken.done():
                        woken.set_result(None)
        except (psycopg.Error, StoreError, OSError) as exc:
            log.debug("LISTEN %s unavailable: %s", self._channel, exc)
        finally:
            self._ready.clear()
            self._failed_at = asyncio.get_running_loop().time()
            self._wake_all()  # they ask again, and poll while the listener is down
            if conn is not None:
                with contextlib.suppress(psycopg.Error, OSError):
                    await conn.close()

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for woken in waiting:
                if not woken.done():
                    woken.set_result(None)

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
