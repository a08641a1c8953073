"""``client.slot(limit, ...)``: wait in line up to ``max_wait``, renew while the block runs,
release on exit, and a slot lost meanwhile cancels the block (issue 29, slots)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ai_lease import Client
from ai_lease.errors import InputError, StoreUnavailable
from ai_lease.lease.slots import SlotFence, SlotLost, SlotState, SlotWaitTimeout
from ai_lease.stores.sqlite.store import SQLiteStore

REAL_TIME = "the store answers from its own thread and judges leases by its own clock"

LIMIT = "local:llama"


class Clock:
    """The store's clock: the wall clock plus a jump a test makes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _slots(client: Client) -> Any:
    return client.store


async def _state(client: Client) -> SlotState:
    state: SlotState = await _slots(client).slot_state(LIMIT)
    return state


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(tmp_path: Path, clock: Clock) -> AsyncIterator[Client]:
    store = SQLiteStore(tmp_path / "slots.db", poll_interval=0.02, clock=clock)
    async with Client(store, closes=(store,)) as client:
        yield client


async def test_a_second_holder_waits_for_the_first_to_leave(client: Client) -> None:
    """With one slot, the second block starts only after the first has left it."""
    order: list[str] = []

    async def hold(name: str, seconds: float) -> None:
        async with client.slot(LIMIT, capacity=1, ttl=5, max_wait=10):
            order.append(f"{name} in")
            await asyncio.sleep(seconds)
            order.append(f"{name} out")

    first = asyncio.ensure_future(hold("a", 0.3))
    await asyncio.sleep(0.1)
    await asyncio.gather(first, hold("b", 0.0))
    assert order == ["a in", "a out", "b in", "b out"]
    assert await _state(client) == SlotState(LIMIT, 0, 0)


async def test_waiting_longer_than_max_wait_raises_naming_the_limit(client: Client) -> None:
    """No slot within max_wait: SlotWaitTimeout names the limit and the wait; the place in
    line is given up at once (nobody is left waiting)."""
    async with client.slot(LIMIT, capacity=1, ttl=5) as held:
        assert held.fence is not None
        started = time.monotonic()
        with pytest.raises(
            SlotWaitTimeout, match=r"no slot of 'local:llama' came free in 0\."
        ) as e:
            async with client.slot(LIMIT, capacity=1, ttl=5, max_wait=0.4):
                pytest.fail("the slot is taken")
        assert 0.4 <= time.monotonic() - started < 3
        assert e.value.limit == LIMIT and e.value.ahead == 0 and e.value.budget_s == 0.4
        assert await _state(client) == SlotState(LIMIT, 1, 0)


async def test_the_slot_is_released_on_exit_even_after_an_error(client: Client) -> None:
    """Leaving the block frees the slot, whether it ended well or raised."""
    store: Any = client.store
    with pytest.raises(ValueError, match="boom"):
        async with client.slot(LIMIT, capacity=2, ttl=5) as held:
            assert (await store.slot_state(LIMIT)).in_use == 1
            raise ValueError("boom")
    assert held.fence is None
    assert (await store.slot_state(LIMIT)).in_use == 0


async def test_renewals_keep_the_slot_beyond_its_ttl(client: Client) -> None:
    """A block longer than the ttl keeps its slot: renewed every ttl / 3."""
    async with client.slot(LIMIT, capacity=1, ttl=0.3) as held:
        fence = held.fence
        await asyncio.sleep(1.0)
        assert fence is not None and await _slots(client).renew_slot(fence, 0.3)


async def test_a_lost_slot_cancels_the_block(client: Client, clock: Clock) -> None:
    """When the store says the slot lapsed (its clock jumped past the lease), the running
    block is cancelled and SlotLost raised: a zombie cannot keep the slot."""
    reached = []
    started = time.monotonic()
    with pytest.raises(SlotLost, match=r"slot of 'local:llama'.*lost: renewal refused"):
        async with client.slot(LIMIT, capacity=1, ttl=0.6):
            clock.offset += 3600  # every lease this store granted has lapsed
            await asyncio.sleep(30)
            reached.append("end")
    assert reached == [] and time.monotonic() - started < 5


class _Unreachable:
    """The SQLite store's slots, but every renewal fails as an unreachable store's does."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self._store, name)  # type: ignore[no-any-return]

    async def renew_slot(self, fence: SlotFence, ttl: float) -> bool:
        raise StoreUnavailable("sqlite:///x", "renew_slot", "no answer", maybe_applied=True)


async def test_no_renewal_landing_cancels_the_block_before_the_lapse(tmp_path: Path) -> None:
    """Renewals that fail (the store unreachable) stop the block before the slot's lease
    could lapse (ttl - ttl / 6 after the grant): SlotLost says no renewal landed."""
    store = SQLiteStore(tmp_path / "slots.db")
    try:
        client = Client(_Unreachable(store), closes=())  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(SlotLost, match="no renewal landed in time"):
            async with client.slot(LIMIT, capacity=1, ttl=0.6):
                await asyncio.sleep(30)
        assert 0.4 <= time.monotonic() - started < 0.6 + 1.0
    finally:
        await store.aclose()


class _ReleaseUnanswered:
    """The SQLite store's slots, but the first ``failures`` releases get no answer."""

    def __init__(self, store: SQLiteStore, failures: int) -> None:
        self._store, self.failures, self.releases = store, failures, 0

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self._store, name)  # type: ignore[no-any-return]

    async def release_slot(self, fence: SlotFence) -> bool:
        self.releases += 1
        if self.releases <= self.failures:
            raise StoreUnavailable("sqlite:///x", "release_slot", "no answer", maybe_applied=False)
        return await self._store.release_slot(fence)


async def test_an_unanswered_release_is_sent_again_while_the_slot_lasts(tmp_path: Path) -> None:
    """Releases the store does not answer are sent again, so the slot is free long before
    its lease (60 s) would lapse; once the lease is over, no more are sent."""
    store = SQLiteStore(tmp_path / "slots.db")
    try:
        flaky = _ReleaseUnanswered(store, failures=2)
        client = Client(flaky, closes=())  # type: ignore[arg-type]
        async with client.slot(LIMIT, capacity=1, ttl=60):
            pass
        assert flaky.releases == 3
        assert (await store.slot_state(LIMIT)).in_use == 0
        never = _ReleaseUnanswered(store, failures=10**6)
        client = Client(never, closes=())  # type: ignore[arg-type]
        started = time.monotonic()
        async with client.slot(LIMIT, capacity=1, ttl=0.3):
            pass
        assert 2 <= never.releases <= 5  # sent again until the 0.3 s lease was over, not after
        assert time.monotonic() - started < 0.3 + 0.4 + 1.0  # one last wait, then given up
    finally:
        await store.aclose()


class _ReleaseSlow:
    """The SQLite store's slots, each release answered only after ``answer_in`` seconds."""

    def __init__(self, store: SQLiteStore, answer_in: float) -> None:
        self._store, self.answer_in = store, answer_in
        self.release_sent = asyncio.Event()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(self._store, name)  # type: ignore[no-any-return]

    async def release_slot(self, fence: SlotFence) -> bool:
        self.release_sent.set()
        await asyncio.sleep(self.answer_in)  # real: the store's answer, late
        return await self._store.release_slot(fence)


async def _held(client: Client, ttl: float) -> asyncio.Task[None]:
    """A task holding one slot of LIMIT (its block sleeping), once it holds it."""
    entered = asyncio.Event()

    async def hold() -> None:
        async with client.slot(LIMIT, capacity=1, ttl=ttl):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.ensure_future(hold())
    await entered.wait()
    return task


async def test_a_second_cancellation_while_giving_back_still_releases(tmp_path: Path) -> None:
    """A stalled job is stopped (one cancellation) and its runner then stopped too (another,
    while the slot is being given back): the release still lands, and the slot is free long
    before its lease (60 s) would lapse; the task ends cancelled at once, not after it."""
    store = SQLiteStore(tmp_path / "slots.db")
    try:
        slow = _ReleaseSlow(store, answer_in=0.3)
        task = await _held(Client(slow, closes=()), ttl=60)  # type: ignore[arg-type]
        task.cancel()
        await slow.release_sent.wait()
        task.cancel()  # the second, while the release waits for its answer
        started = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 0.2  # the cancellation did not wait for the store
        deadline = time.monotonic() + 10
        while (await store.slot_state(LIMIT)).in_use:
            assert time.monotonic() < deadline, "the slot was never given back"
            await asyncio.sleep(0.02)  # real: the release answers from SQLite's thread
    finally:
        await store.aclose()


async def test_a_cancellation_from_outside_wins_and_releases(client: Client) -> None:
    """A block cancelled from outside raises CancelledError (not SlotLost) and frees its slot."""
    task = await _held(client, ttl=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await _state(client)).in_use == 0


@pytest.mark.parametrize(
    ("limit", "options", "said"),
    [
        (LIMIT, {"capacity": 0}, "capacity 0 is not in 1..10000"),
        (LIMIT, {"capacity": 10_001}, "capacity 10001 is not in 1..10000"),
        (LIMIT, {"capacity": 2.0}, "capacity must be an int"),
        (LIMIT, {"ttl": -1}, "ttl -1s is not in"),
        (LIMIT, {"max_wait": float("inf")}, "max_wait must be a number of seconds"),
        (LIMIT, {"max_wait": 10**6}, "max_wait 1e\\+06s is not in"),
        (LIMIT, {"priority": -101}, "priority -101 is not an int"),
        ("", {}, "limit name '' is invalid"),
        ("a" * 201, {}, "is invalid: use 1 to 200 characters"),
        ("gpt 4", {}, "limit name 'gpt 4' is invalid"),
    ],
)
async def test_outside_values_are_bounded_with_clear_errors(
    client: Client, limit: str, options: dict[str, Any], said: str
) -> None:
    """Every value a caller passes is checked before anything is sent."""
    with pytest.raises(InputError, match=said):
        client.slot(limit, **({"capacity": 1} | options))
