"""Followers of the PostgreSQL store wake on LISTEN/NOTIFY: one listening connection per store.

The functions that end a lease or a job NOTIFY the namespace's channel with the job's key as
the payload, in their own transaction (delivered when it commits). A store object keeps one
connection LISTENing on that channel and a table of key -> waiting futures: a thousand
followers cost one connection, not a thousand. When the listener cannot connect, or its
connection drops, every waiter is woken (a follower that wakes early just asks again) and
waits fall back to polling the record every ``poll_interval`` until the listener is back;
it is tried again once per second, by the listener itself. Each (re)connect wakes every
waiter once: a NOTIFY sent while nobody listened was lost, so they read the record again.
A connection quiet for :data:`CHECK_EVERY` seconds is checked with one bounded statement
(a frozen server answers no keepalive-free question), and libpq's TCP keepalives (set by
stores/postgres/conn.py) catch a peer that vanished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from ai_lease.errors import AiLeaseError, StoreError
from ai_lease.stores.postgres.schema import notify_payload

__all__ = ["CHECK_EVERY", "Listener"]

log = logging.getLogger("ai_lease.store")

_RETRY_AFTER = 1.0  # seconds between attempts to bring a failed listener back

CHECK_EVERY = 10.0
"""Seconds of silence after which the listener checks its connection with one statement."""


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
        check_every: float = CHECK_EVERY,
    ) -> None:
        self._channel, self._connect, self._version = channel, connect, changed
        self._poll, self._ready_timeout = poll_interval, ready_timeout
        self._check_every = check_every
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
        """Whether the listener is up (started if need be; on its first start waited for up
        to ``timeout``; once it has failed, waits poll until it is back)."""
        if self._ready.is_set():
            return True
        if self._closed:
            return False
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=f"ai-lease-listen:{self._channel}")
        if self._failed_at is not None:
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ready.wait()
        return self._ready.is_set()

    async def _poll_until(self, key: str, deadline: float, woken: asyncio.Future[None]) -> None:
        """Poll the record until it changes, ``deadline``, or ``woken`` (the listener back)."""
        loop = asyncio.get_running_loop()
        try:
            first = await self._version(key)
        except StoreError:
            first = None
        while (left := deadline - loop.time()) > 0 and not woken.done():
            await asyncio.wait({woken}, timeout=min(self._poll, left))
            if woken.done():
                return
            try:
                if await self._version(key) != first:
                    return
            except StoreError:
                continue

    async def _run(self) -> None:
        """Listen until closed: a lost connection is replaced every :data:`_RETRY_AFTER`."""
        while not self._closed:
            await self._listen()
            await asyncio.sleep(_RETRY_AFTER)

    async def _listen(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await self._connect()
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._ready.set()
            self._failed_at = None
            self._wake_all()  # a NOTIFY before LISTEN was up went unheard: they read again
            while True:
                async for notice in conn.notifies(timeout=self._check_every):
                    for woken in self._waiters.get(notice.payload, ()):
                        if not woken.done():
                            woken.set_result(None)
                await self._check(conn)
        except (psycopg.Error, AiLeaseError, OSError, TimeoutError) as exc:  # typed: refused
            log.debug("LISTEN %s unavailable: %s", self._channel, exc)
        finally:
            self._down()
            if conn is not None:
                with contextlib.suppress(psycopg.Error, OSError):
                    await conn.close()

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """A quiet connection may be dead (a frozen server, a cut without a reset that the
        TCP keepalives have not caught yet): one cheap statement, bounded. Timed out, the
        waiters are set polling first, then psycopg's own cancel runs (bounded by it)."""
        check = asyncio.ensure_future(conn.execute("SELECT 1"))
        await asyncio.wait({check}, timeout=self._ready_timeout)
        if not check.done():
            self._down()
            check.cancel()
            await asyncio.wait({check})
            raise TimeoutError(f"no answer to a check within {self._ready_timeout:g}s")
        check.result()

    def _down(self) -> None:
        """The listener is not listening: every waiter is woken (they ask again, and poll
        until it is back)."""
        self._ready.clear()
        self._failed_at = asyncio.get_running_loop().time()
        self._wake_all()

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
