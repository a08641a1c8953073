"""The SQLite store's provider slots (:class:`~ai_lease.lease.slots.SlotStore`): tables beside
the jobs' (``ai_lease_slots``, ``ai_lease_slot_waiters``, ``ai_lease_slot_limits``,
``ai_lease_slot_pauses``: the holders, the waiting line, each limit's counter and pause), one
write transaction per operation.

Processes on one machine share the file, so waiters poll for a release every
``poll_interval`` (as followers do): there is no channel between processes to wake them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from ai_lease.lease.slots import (
    WAIT_TTL,
    SlotFence,
    SlotGrant,
    SlotOutcome,
    SlotState,
    SlotWait,
    check_limit,
    check_pause,
    check_slot_args,
    check_weight,
)
from ai_lease.lease.storable import check_owner
from ai_lease.stores.sqlite.file import SQLiteFile

__all__ = ["SQLiteSlots"]

SLOT_POLL_S = 0.05
"""How often a slot's waiter looks for a release on SQLite (no push between processes here):
the ``store.poll_interval`` if shorter; a waiter further back in line looks ``ahead + 1`` times
less often. A one-slot limit hands over about this late at worst, not a whole
``poll_interval`` (1 s by default) per call; a look is one indexed read."""

_HOLDER = "SELECT token, expires_at FROM ai_lease_slots WHERE limit_name = ? AND owner_id = ?"
_PAUSED = "SELECT until FROM ai_lease_slot_pauses WHERE limit_name = ?"


def _paused(conn: sqlite3.Connection, limit: str, now: float) -> float:
    """Seconds the limit stays paused (0: it grants)."""
    row = conn.execute(_PAUSED, (limit,)).fetchone()
    return 0.0 if row is None else max(0.0, float(row[0]) - now)


def _sweep(conn: sqlite3.Connection, limit: str, now: float) -> None:
    """Reclaim the limit's lapsed slots and drop the waiters that stopped asking."""
    for table in ("ai_lease_slots", "ai_lease_slot_waiters"):
        conn.execute(f"DELETE FROM {table} WHERE limit_name = ? AND expires_at <= ?", (limit, now))


def _next(conn: sqlite3.Connection, limit: str) -> int:
    """The limit's counter, moved on by one (tokens and places in line both come from it)."""
    conn.execute(
        "INSERT INTO ai_lease_slot_limits VALUES (?, 1) ON CONFLICT(limit_name)"
        " DO UPDATE SET last = last + 1",
        (limit,),
    )
    row = conn.execute(
        "SELECT last FROM ai_lease_slot_limits WHERE limit_name = ?", (limit,)
    ).fetchone()
    return int(row[0])


def _place(
    conn: sqlite3.Connection, limit: str, owner: str, priority: int
) -> tuple[int, int | None, int]:
    """The caller's place in line: its priority and number (kept from its first ask; None
    for a newcomer, numbered only if it must wait), and how many waiters come before it (a
    higher priority, or the same and asked first: for a newcomer, every one of them)."""
    row = conn.execute(
        "SELECT priority, seq FROM ai_lease_slot_waiters WHERE limit_name = ? AND owner_id = ?",
        (limit, owner),
    ).fetchone()
    prio, seq = (int(row[0]), int(row[1])) if row is not None else (priority, None)
    (ahead,) = conn.execute(
        "SELECT count(*) FROM ai_lease_slot_waiters WHERE limit_name = ?1 AND owner_id <> ?2"
        " AND (priority > ?3 OR (priority = ?3 AND (?4 IS NULL OR seq < ?4)))",
        (limit, owner, prio, seq),
    ).fetchone()
    return prio, seq, int(ahead)


class SQLiteSlots:
    """The slots part of the SQLite store."""

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file

    async def acquire_slot(
        self,
        limit: str,
        owner_id: str,
        *,
        capacity: int,
        ttl: float,
        priority: int = 0,
        wait_ttl: float = WAIT_TTL,
        weight: int | None = None,
    ) -> SlotOutcome:
        limit = check_slot_args(
            limit, capacity=capacity, ttl=ttl, priority=priority, wait_ttl=wait_ttl, weight=weight
        )
        owner, units = check_owner(owner_id), weight or 1

        def work(conn: sqlite3.Connection) -> SlotOutcome:
            now = self._file._clock()
            _sweep(conn, limit, now)
            held = conn.execute(_HOLDER, (limit, owner)).fetchone()
            if held is not None:  # asked again (a lost reply): its own slot, renewed
                return self._hold(conn, limit, owner, int(held[0]), now, ttl)
            (in_use,) = conn.execute(
                "SELECT coalesce(sum(weight), 0) FROM ai_lease_slots WHERE limit_name = ?",
                (limit,),
            ).fetchone()
            prio, seq, ahead = _place(conn, limit, owner, priority)
            paused = _paused(conn, limit, now)
            if not paused and (units == 1 or ahead == 0) and ahead + units <= capacity - in_use:
                conn.execute(
                    "DELETE FROM ai_lease_slot_waiters WHERE limit_name = ? AND owner_id = ?",
                    (limit, owner),
                )
                token = _next(conn, limit)
                return self._hold(conn, limit, owner, token, now, ttl, units)
            conn.execute(
                "INSERT INTO ai_lease_slot_waiters VALUES (?, ?, ?, ?, ?) ON CONFLICT"
                " (limit_name, owner_id) DO UPDATE SET expires_at = excluded.expires_at",
                (limit, owner, prio, _next(conn, limit) if seq is None else seq, now + wait_ttl),
            )
            return SlotWait(ahead, int(in_use), paused)

        return await self._file._write("acquire_slot", work)

    @staticmethod
    def _hold(
        conn: sqlite3.Connection,
        limit: str,
        owner: str,
        token: int,
        now: float,
        ttl: float,
        weight: int = 1,
    ) -> SlotGrant:
        conn.execute(
            "INSERT INTO ai_lease_slots (limit_name, owner_id, token, expires_at, weight)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (limit_name, owner_id)"
            " DO UPDATE SET expires_at = excluded.expires_at",
            (limit, owner, token, now + ttl, weight),
        )
        return SlotGrant(SlotFence(limit, owner, token), now + ttl, now)

    async def renew_slot(self, fence: SlotFence, ttl: float) -> bool:
        """Extend the slot's lease by ``ttl`` from now; False once it lapsed or is not yours."""
        check_slot_args(fence.limit, capacity=1, ttl=ttl)

        def work(conn: sqlite3.Connection) -> bool:
            now = self._file._clock()
            live = self._holds(conn, fence, now)
            if live:
                conn.execute(
                    "UPDATE ai_lease_slots SET expires_at = ?"
                    " WHERE limit_name = ? AND owner_id = ?",
                    (now + ttl, fence.limit, fence.owner_id),
                )
            return live

        return await self._file._write("renew_slot", work)

    async def release_slot(self, fence: SlotFence) -> bool:
        check_limit(fence.limit)

        def work(conn: sqlite3.Connection) -> bool:
            return self._holds(conn, fence, self._file._clock(), drop=True)

        return await self._file._write("release_slot", work)

    def _holds(
        self, conn: sqlite3.Connection, fence: SlotFence, now: float, *, drop: bool = False
    ) -> bool:
        """Whether ``fence`` holds a live slot; its entry is dropped if it lapsed (or if
        ``drop``). A stale fence (another token) touches nothing."""
        row = conn.execute(_HOLDER, (fence.limit, fence.owner_id)).fetchone()
        if row is None or int(row[0]) != fence.token:
            return False
        live = bool(row[1] > now)
        if drop or not live:
            conn.execute(
                "DELETE FROM ai_lease_slots WHERE limit_name = ? AND owner_id = ?",
                (fence.limit, fence.owner_id),
            )
        return live

    async def reweigh_slot(self, fence: SlotFence, weight: int) -> bool:
        check_weight(check_limit(fence.limit), weight)

        def work(conn: sqlite3.Connection) -> bool:
            live = self._holds(conn, fence, self._file._clock())
            if live:
                conn.execute(
                    "UPDATE ai_lease_slots SET weight = ? WHERE limit_name = ? AND owner_id = ?",
                    (weight, fence.limit, fence.owner_id),
                )
            return live

        return await self._file._write("reweigh_slot", work)

    async def leave_slot(self, limit: str, owner_id: str) -> None:
        limit = check_limit(limit)

        def work(conn: sqlite3.Connection) -> None:
            for table in ("ai_lease_slots", "ai_lease_slot_waiters"):
                conn.execute(
                    f"DELETE FROM {table} WHERE limit_name = ? AND owner_id = ?", (limit, owner_id)
                )

        await self._file._write("leave_slot", work)

    async def pause_slot(self, limit: str, seconds: float) -> float:
        seconds = check_pause(limit, seconds)

        def work(conn: sqlite3.Connection) -> float:
            now = self._file._clock()
            until = max(now + seconds, now + _paused(conn, limit, now))
            conn.execute(
                "INSERT INTO ai_lease_slot_pauses VALUES (?, ?) ON CONFLICT (limit_name)"
                " DO UPDATE SET until = excluded.until",
                (limit, until),
            )
            return until - now

        return await self._file._write("pause_slot", work)

    async def slot_state(self, limit: str) -> SlotState:
        limit = check_limit(limit)

        def work(conn: sqlite3.Connection) -> SlotState:
            in_use, waiting = _counts(conn, limit, self._file._clock())
            return SlotState(limit, in_use, waiting)

        return await self._file._run("slot_state", work)

    async def wait_slot(self, limit: str, timeout: float, *, ahead: int = 0) -> None:
        """Return once the limit's holders change (a release, a grant, a lapse) or after
        ``timeout``, polling every :data:`SLOT_POLL_S` while first in line, ``ahead + 1``
        times that further back (``poll_interval`` at most): the one to be granted next looks
        often, the line behind it does not load the file."""
        limit = check_limit(limit)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first = await self._file._run("wait_slot", lambda conn: self._seen(conn, limit))
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(self._file._poll, SLOT_POLL_S * (1 + max(0, ahead)), left))
            if await self._file._run("wait_slot", lambda conn: self._seen(conn, limit)) != first:
                return

    def _seen(self, conn: sqlite3.Connection, limit: str) -> Any:
        """What changes when a slot is freed or taken: live holders, and the counter."""
        last = conn.execute(
            "SELECT last FROM ai_lease_slot_limits WHERE limit_name = ?", (limit,)
        ).fetchone()
        return _counts(conn, limit, self._file._clock())[0], last


def _counts(conn: sqlite3.Connection, limit: str, now: float) -> tuple[int, int]:
    """Live holders (their units) and live waiters of ``limit`` at ``now``."""
    in_use, waiting = conn.execute(
        "SELECT (SELECT coalesce(sum(weight), 0) FROM ai_lease_slots"
        " WHERE limit_name = ?1 AND expires_at > ?2),"
        " (SELECT count(*) FROM ai_lease_slot_waiters WHERE limit_name = ?1 AND expires_at > ?2)",
        (limit, now),
    ).fetchone()
    return int(in_use), int(waiting)
