"""The Redis store's provider slots (:class:`~ai_lease.lease.slots.SlotStore`): one script
per operation (stores/redis/slot_scripts.py) on one limit's keys, which share a hash tag (one
Cluster slot). A release publishes on the limit's channel: waiters subscribe to it and ask
again when it speaks, not on a timer of their own.
"""

from __future__ import annotations

import math

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
from ai_lease.stores.redis.calls import RedisCalls
from ai_lease.stores.redis.keys import slot_keys, us
from ai_lease.stores.redis.wire import wait_message

__all__ = ["RedisSlots"]

KEEP_MARGIN_MS = 60_000
"""How much longer than the longest lease or waiter entry a limit's keys are kept."""


def _keep_ms(*seconds: float) -> int:
    return math.ceil(max(seconds) * 1000) + KEEP_MARGIN_MS


class RedisSlots:
    """The slots part of the Redis store."""

    def __init__(self, calls: RedisCalls) -> None:
        self._calls = calls

    def _keys(self, limit: str) -> list[str]:
        return slot_keys(self._calls._ns, limit)

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
        keep = _keep_ms(ttl, wait_ttl)
        args = [owner, capacity, us(ttl), us(wait_ttl), priority, keep, weight or 1]
        reply = await self._calls._eval(
            "acquire_slot", "ACQUIRE_SLOT", self._keys(limit), args, limit
        )
        now = int(reply[3]) / 1_000_000
        if reply[0] == "granted":
            fence = SlotFence(limit, owner, int(reply[1]))
            return SlotGrant(fence, int(reply[2]) / 1_000_000, now)
        return SlotWait(int(reply[1]), int(reply[2]), int(reply[4]) / 1000)

    async def renew_slot(self, fence: SlotFence, ttl: float) -> bool:
        """Extend the slot's lease by ``ttl`` from now; False once it lapsed or is not yours."""
        check_slot_args(fence.limit, capacity=1, ttl=ttl)
        args = [fence.owner_id, str(fence.token), us(ttl), _keep_ms(ttl)]
        reply = await self._calls._eval(
            "renew_slot", "RENEW_SLOT", self._keys(fence.limit), args, fence.limit
        )
        return bool(reply[0])

    async def release_slot(self, fence: SlotFence) -> bool:
        check_limit(fence.limit)
        args = [fence.owner_id, str(fence.token)]
        keys = self._keys(fence.limit)
        return bool(await self._calls._eval("release_slot", "RELEASE_SLOT", keys, args))

    async def reweigh_slot(self, fence: SlotFence, weight: int) -> bool:
        check_weight(check_limit(fence.limit), weight)
        args = [fence.owner_id, str(fence.token), weight]
        keys = self._keys(fence.limit)
        return bool(await self._calls._eval("reweigh_slot", "REWEIGH_SLOT", keys, args))

    async def leave_slot(self, limit: str, owner_id: str) -> None:
        keys = self._keys(check_limit(limit))
        await self._calls._eval("leave_slot", "RELEASE_SLOT", keys, [owner_id, ""])

    async def slot_state(self, limit: str) -> SlotState:
        holders, _, waiting_key, *_, weights = self._keys(check_limit(limit))
        keys = [holders, waiting_key, weights]
        in_use, waiting = await self._calls._eval("slot_state", "SLOT_STATE", keys, [])
        return SlotState(limit, int(in_use), int(waiting))

    async def wait_slot(self, limit: str, timeout: float, *, ahead: int = 0) -> None:
        """Return on the limit's next release (its channel) or after ``timeout``; where
        pub/sub is unavailable, sleep out ``timeout`` (waiters ask again then)."""
        await wait_message(self._calls._pubsub, self._keys(check_limit(limit))[5], timeout)

    async def pause_slot(self, limit: str, seconds: float) -> float:
        ms = max(1, round(check_pause(limit, seconds) * 1000))
        keys = self._keys(check_limit(limit))[6:7]
        return int(await self._calls._eval("pause_slot", "PAUSE_SLOT", keys, [ms], limit)) / 1000
