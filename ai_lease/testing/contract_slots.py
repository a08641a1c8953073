"""The provider-slot contract: what a :class:`~ai_lease.lease.slots.SlotStore` promises.

A third-party store subclasses :class:`SlotContract` and provides a ``store`` fixture, as for
the lease contract. Lapses are judged by the store's own clock, so those tests wait in real
time, with small leases and generous bounds.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from ai_lease.errors import InputError
from ai_lease.lease.slots import MAX_CAPACITY, MAX_UNITS, SlotFence, SlotGrant, SlotState, SlotWait

__all__ = ["SlotContract"]

_ids = itertools.count()


def limit_for(name: str) -> str:
    return f"contract:{name}-{time.time_ns()}-{next(_ids)}"


async def grant(store: Any, limit: str, owner: str, capacity: int = 1, **kw: Any) -> SlotFence:
    outcome = await store.acquire_slot(limit, owner, capacity=capacity, ttl=kw.pop("ttl", 30), **kw)
    assert isinstance(outcome, SlotGrant), outcome
    return outcome.fence


async def wait(store: Any, limit: str, owner: str, capacity: int = 1, **kw: Any) -> SlotWait:
    outcome = await store.acquire_slot(limit, owner, capacity=capacity, ttl=30, **kw)
    assert isinstance(outcome, SlotWait), outcome
    return outcome


class SlotContract:
    """Slots every built-in store keeps (``ai_lease.lease.slots.SlotStore``)."""

    async def test_never_more_than_capacity_holders(self, store: Any) -> None:
        """Of eight callers asking for three slots, three hold one and five wait; the state
        says so; each holder's token is its own and they increase."""
        limit = limit_for("cap")
        outcomes = [await store.acquire_slot(limit, f"o{n}", capacity=3, ttl=30) for n in range(8)]
        grants = [o for o in outcomes if isinstance(o, SlotGrant)]
        assert [o.fence.owner_id for o in grants] == ["o0", "o1", "o2"]
        tokens = [o.fence.token for o in grants]
        assert tokens == sorted(set(tokens))
        waits = [o for o in outcomes if isinstance(o, SlotWait)]
        assert [o.ahead for o in waits] == [0, 1, 2, 3, 4]
        assert all(o.in_use == 3 for o in waits)
        assert await store.slot_state(limit) == SlotState(limit, 3, 5)
        assert isinstance(grants[0].lease_remaining, float) and grants[0].lease_remaining > 20

    async def test_waiters_are_served_first_come_first_served(self, store: Any) -> None:
        """A freed slot goes to the waiter that asked first: a later one asking before it
        gets none; a higher priority goes before both."""
        limit = limit_for("fifo")
        first = await grant(store, limit, "holder")
        assert (await wait(store, limit, "b")).ahead == 0
        assert (await wait(store, limit, "c")).ahead == 1
        assert (await wait(store, limit, "urgent", priority=5)).ahead == 0
        assert (await wait(store, limit, "b")).ahead == 1  # asking again keeps its place
        assert await store.release_slot(first)
        assert (await wait(store, limit, "c")).ahead == 2, "c is behind urgent and b"
        assert (await wait(store, limit, "b")).ahead == 1
        second = await grant(store, limit, "urgent")
        assert await store.release_slot(second)
        assert (await wait(store, limit, "c")).ahead == 1
        third = await grant(store, limit, "b")
        assert third.token > second.token > first.token

    async def test_a_paused_limit_grants_nothing_until_the_pause_ends(self, store: Any) -> None:
        """While paused no one gets a slot, even with slots free: waiters keep their places
        in order and hear how long is left; a holder keeps its slot; a shorter pause keeps
        the later end; after the end the first in line is granted."""
        limit = limit_for("pause")
        held = await grant(store, limit, "holder", capacity=3)
        left = await store.pause_slot(limit, 0.8)
        assert 0.7 < left <= 0.8
        assert 0.7 < await store.pause_slot(limit, 0.1) <= 0.8, "the later end is kept"
        first = await wait(store, limit, "first", capacity=3)
        second = await wait(store, limit, "second", capacity=3)
        assert (first.ahead, second.ahead, first.in_use) == (0, 1, 1)
        assert 0.2 < second.paused <= 0.8
        assert await store.renew_slot(held, 30), "a held slot stays held through a pause"
        await asyncio.sleep(1.0)  # real: the pause ends on the store's own clock
        granted = await grant(store, limit, "first", capacity=3)
        assert granted.token > held.token
        assert (await wait(store, limit, "third", capacity=2)).paused == 0
        with pytest.raises(InputError, match="pause"):
            await store.pause_slot(limit, 0)

    async def test_weighted_slots_count_their_units(self, store: Any) -> None:
        """A weighted holder takes its weight in units: a weight that does not fit waits,
        first in line, and a smaller one asking later does not pass it; a reweigh to fewer
        units (a fenced one) lets it in; a stale fence reweighs nothing."""
        limit = limit_for("weight")
        big = await grant(store, limit, "big", capacity=100, weight=70)
        assert await store.slot_state(limit) == SlotState(limit, 70, 0)
        first = await wait(store, limit, "first", capacity=100, weight=40)
        assert (first.ahead, first.in_use) == (0, 70)
        assert (await wait(store, limit, "small", capacity=100, weight=5)).ahead == 1
        assert await store.reweigh_slot(big, 20)
        assert await store.slot_state(limit) == SlotState(limit, 20, 2)
        later = await grant(store, limit, "first", capacity=100, weight=40)
        assert (await store.slot_state(limit)).in_use == 60
        stale = SlotFence(limit, "big", big.token + 1000)
        assert not await store.reweigh_slot(stale, 1)
        assert await store.release_slot(later)
        assert await store.slot_state(limit) == SlotState(limit, 20, 1)
        assert isinstance(await grant(store, limit, "small", capacity=100, weight=5), SlotFence)
        with pytest.raises(InputError, match="weight"):
            await store.acquire_slot(limit, "huge", capacity=100, ttl=30, weight=101)
        with pytest.raises(InputError, match="weight"):
            await store.reweigh_slot(big, 0)

    async def test_a_lapsed_weighted_holder_gives_its_units_back(self, store: Any) -> None:
        """A weighted place left to lapse (a rate window's) frees its units by itself."""
        limit = limit_for("weight-lapse")
        old = await grant(store, limit, "old", capacity=10, weight=9, ttl=0.3)
        assert (await wait(store, limit, "next", capacity=10, weight=5)).in_use == 9
        await asyncio.sleep(0.6)  # real: the place lapses on the store's own clock
        await grant(store, limit, "next", capacity=10, weight=5)
        assert await store.slot_state(limit) == SlotState(limit, 5, 0)
        assert not await store.reweigh_slot(old, 1), "a lapsed place is not reweighed"

    async def test_asking_again_while_holding_gives_the_same_slot(self, store: Any) -> None:
        """A holder asking again (its reply was lost) gets its own slot and token back."""
        limit = limit_for("again")
        fence = await grant(store, limit, "a")
        assert await grant(store, limit, "a") == fence
        assert (await store.slot_state(limit)).in_use == 1

    async def test_a_lapsed_holder_is_reclaimed_by_the_next_acquire(self, store: Any) -> None:
        """A holder that stopped renewing loses its slot to the next caller after its ttl;
        its late renewal and release are refused."""
        limit = limit_for("lapse")
        old = await grant(store, limit, "zombie", ttl=0.3)
        await wait(store, limit, "next")
        await asyncio.sleep(0.6)  # real: the lease lapses on the store's own clock
        new = await grant(store, limit, "next")
        assert new.token > old.token
        assert not await store.renew_slot(old, 30)
        assert not await store.release_slot(old)
        assert await store.slot_state(limit) == SlotState(limit, 1, 0)

    async def test_renewal_keeps_the_slot_and_a_lapse_refuses_it(self, store: Any) -> None:
        """A renewed slot outlives its first ttl; one left to lapse is refused renewal."""
        limit = limit_for("renew")
        fence = await grant(store, limit, "a", ttl=0.6)
        for _ in range(3):
            await asyncio.sleep(0.3)  # real: renewals on the store's own clock
            assert await store.renew_slot(fence, 0.6)
        await wait(store, limit, "b")
        await asyncio.sleep(0.9)  # real: the lease lapses on the store's own clock
        assert not await store.renew_slot(fence, 0.6)
        assert (await store.slot_state(limit)).in_use == 0

    async def test_a_stale_fence_releases_and_renews_nothing(self, store: Any) -> None:
        """Another token, or the same token under another owner id, frees nothing."""
        limit = limit_for("stale")
        fence = await grant(store, limit, "a")
        for stale in (
            SlotFence(limit, "a", fence.token + 1),
            SlotFence(limit, "a", fence.token - 1),
            SlotFence(limit, "b", fence.token),
        ):
            assert not await store.release_slot(stale)
            assert not await store.renew_slot(stale, 30)
        assert (await store.slot_state(limit)).in_use == 1
        assert await store.renew_slot(fence, 30)
        assert await store.release_slot(fence)
        assert not await store.release_slot(fence), "released once only"
        assert (await store.slot_state(limit)).in_use == 0

    async def test_a_waiter_that_stopped_asking_does_not_block(self, store: Any) -> None:
        """A waiter's place lapses ``wait_ttl`` after its last ask: the one behind it gets
        the freed slot, and the state no longer counts it."""
        limit = limit_for("gone")
        holder = await grant(store, limit, "holder")
        await wait(store, limit, "dead", wait_ttl=0.3)
        assert (await wait(store, limit, "alive")).ahead == 1
        assert await store.release_slot(holder)
        await asyncio.sleep(0.6)  # real: the waiter's entry lapses on the store's own clock
        assert await store.slot_state(limit) == SlotState(limit, 0, 1)
        await grant(store, limit, "alive")

    async def test_leaving_gives_up_the_place_in_line_and_the_slot(self, store: Any) -> None:
        """``leave_slot`` drops a waiter's place at once, and a slot its owner holds."""
        limit = limit_for("leave")
        holder = await grant(store, limit, "holder")
        await wait(store, limit, "quitter")
        assert (await wait(store, limit, "patient")).ahead == 1
        await store.leave_slot(limit, "quitter")
        assert (await wait(store, limit, "patient")).ahead == 0
        await store.leave_slot(limit, "holder")
        assert not await store.renew_slot(holder, 30)
        await grant(store, limit, "patient")

    async def test_limits_are_independent(self, store: Any) -> None:
        """Each limit has its own slots and line."""
        one, two = limit_for("one"), limit_for("two")
        await grant(store, one, "a")
        await grant(store, two, "a")
        await wait(store, one, "b")
        assert await store.slot_state(two) == SlotState(two, 1, 0)

    async def test_a_release_wakes_a_waiter(self, store: Any) -> None:
        """``wait_slot`` returns soon after a release, long before its timeout."""
        limit = limit_for("wake")
        fence = await grant(store, limit, "a")
        waiting = asyncio.ensure_future(store.wait_slot(limit, 20))
        await asyncio.sleep(0.3)  # real: the waiter subscribes (or reads) before the release
        started = time.monotonic()
        assert await store.release_slot(fence)
        await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - started < 5

    async def test_bad_inputs_are_refused_before_anything_is_sent(self, store: Any) -> None:
        """Capacity out of 1..10,000, a bad ttl or priority, or a limit name that is empty,
        too long or holds odd characters: an InputError naming the value."""
        limit = limit_for("bad")
        bad: list[tuple[str, dict[str, Any]]] = [
            (limit, {"capacity": 0}),
            (limit, {"capacity": MAX_CAPACITY + 1}),
            (limit, {"capacity": True}),
            (limit, {"ttl": 0}),
            (limit, {"ttl": float("nan")}),
            (limit, {"priority": 101}),
            (limit, {"wait_ttl": 0}),
            (limit, {"weight": 0}),
            (limit, {"weight": 2, "capacity": MAX_UNITS + 1}),
            ("", {}),
            ("x" * 201, {}),
            ("open ai", {}),
            ("{tag}", {}),
            (":leading", {}),
        ]
        for name, change in bad:
            args = {"capacity": 1, "ttl": 30.0} | change
            with pytest.raises(InputError):
                await store.acquire_slot(name, "a", **args)
        assert await store.slot_state(limit) == SlotState(limit, 0, 0)
