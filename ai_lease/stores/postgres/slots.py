"""The PostgreSQL store's provider slots (:class:`~ai_lease.lease.slots.SlotStore`): one
function call per operation (stores/postgres/slots_sql.py). Waiters wake on the store's one
LISTEN connection (stores/postgres/notify.py): a freed slot NOTIFYs ``chr(31) || limit``
(:data:`WAKE` + the limit), and while LISTEN is down they poll the limit's holders.
"""

from __future__ import annotations

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
from ai_lease.stores.postgres.conn import PostgresConn
from ai_lease.stores.postgres.notify import Listener

__all__ = ["WAKE", "PostgresSlots"]

WAKE = "\x1f"
"""What a limit's wake-up payload starts with (no job key holds a control character)."""

_ACQUIRE = "SELECT * FROM {schema}.ail_slot_acquire(%s, %s, %s, %s, %s, %s, %s)"
_REWEIGH = "SELECT {schema}.ail_slot_reweigh(%s, %s, %s, %s)"
_RENEW = "SELECT {schema}.ail_slot_renew(%s, %s, %s, %s)"
_RELEASE = "SELECT {schema}.ail_slot_release(%s, %s, %s)"
_PAUSE = "SELECT {schema}.ail_slot_pause(%s, %s)"
_NOW = "extract(epoch FROM clock_timestamp())"
_STATE = (
    f"SELECT (SELECT coalesce(sum(weight), 0) FROM {{schema}}.ail_slots WHERE limit_name = %s"
    f" AND expires_at > {_NOW}), (SELECT count(*) FROM {{schema}}.ail_slot_waiters"
    f" WHERE limit_name = %s AND expires_at > {_NOW})"
)
_SEEN = (
    f"SELECT (SELECT coalesce(sum(weight), 0) FROM {{schema}}.ail_slots WHERE limit_name = %s"
    f" AND expires_at > {_NOW}), (SELECT last FROM {{schema}}.ail_slot_limits"
    " WHERE limit_name = %s)"
)


class PostgresSlots:
    """The slots part of the PostgreSQL store."""

    def __init__(self, conn: PostgresConn, listener: Listener) -> None:
        self._conn, self._listener = conn, listener

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
        owner = check_owner(owner_id)
        args = (limit, owner, capacity, float(ttl), float(wait_ttl), priority, weight or 1)
        row = await self._conn._fetchone("acquire_slot", _ACQUIRE, args)
        assert row is not None  # one row, always
        kind, token, expires, ahead, in_use, now, paused = row
        if kind == "granted":
            return SlotGrant(SlotFence(limit, owner, int(token)), float(expires), float(now))
        return SlotWait(int(ahead), int(in_use), float(paused))

    async def renew_slot(self, fence: SlotFence, ttl: float) -> bool:
        """Extend the slot's lease by ``ttl`` from now; False once it lapsed or is not yours."""
        check_slot_args(fence.limit, capacity=1, ttl=ttl)
        args = (fence.limit, fence.owner_id, fence.token, float(ttl))
        row = await self._conn._fetchone("renew_slot", _RENEW, args)
        return bool(row and row[0])

    async def release_slot(self, fence: SlotFence) -> bool:
        check_limit(fence.limit)
        args = (fence.limit, fence.owner_id, fence.token)
        row = await self._conn._fetchone("release_slot", _RELEASE, args)
        return bool(row and row[0])

    async def reweigh_slot(self, fence: SlotFence, weight: int) -> bool:
        check_weight(check_limit(fence.limit), weight)
        args = (fence.limit, fence.owner_id, fence.token, weight)
        row = await self._conn._fetchone("reweigh_slot", _REWEIGH, args)
        return bool(row and row[0])

    async def leave_slot(self, limit: str, owner_id: str) -> None:
        args = (check_limit(limit), owner_id, None)
        await self._conn._fetchone("leave_slot", _RELEASE, args)

    async def pause_slot(self, limit: str, seconds: float) -> float:
        args = (check_limit(limit), check_pause(limit, seconds))
        row = await self._conn._fetchone("pause_slot", _PAUSE, args)
        assert row is not None  # one row, always
        return float(row[0])

    async def slot_state(self, limit: str) -> SlotState:
        limit = check_limit(limit)
        row = await self._conn._fetchone("slot_state", _STATE, (limit, limit))
        assert row is not None  # one row, always
        return SlotState(limit, int(row[0]), int(row[1]))

    async def wait_slot(self, limit: str, timeout: float, *, ahead: int = 0) -> None:
        """Return on the limit's next wake-up NOTIFY or after ``timeout``."""
        await self._listener.wait(WAKE + check_limit(limit), timeout)

    async def seen(self, limit: str) -> Any:
        """What changes when a slot is freed or taken (the listener's polling fallback)."""
        return await self._conn._fetchone("wait_slot", _SEEN, (limit, limit))
