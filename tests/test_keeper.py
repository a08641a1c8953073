"""The lease keeper's decisions, tick by tick, on an injected clock and a real SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ai_lease import (
    Fence,
    LeaseLost,
    LeaseTimings,
    StageBudget,
    Stalled,
    StallPolicy,
    Status,
    StoreUnavailable,
)
from ai_lease.lease import Acquired, Following, Renewal
from ai_lease.lease.events import Event
from ai_lease.lease.keeper import LeaseKeeper, alongside
from ai_lease.lease.progress import Progress
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.clock import VirtualClock

TIMINGS = LeaseTimings(ttl=30, renew_interval=5, op_timeout=1, self_fence_margin=2)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "k.db")
    yield store
    await store.aclose()


async def _keeper(
    store: SQLiteStore, policy: StallPolicy = StallPolicy.EXPIRE, misses: int = 1
) -> tuple[LeaseKeeper, Progress, VirtualClock, list[Event]]:
    won = await store.acquire("job", "A", ttl=30, max_no_progress=5, stall_policy=policy.value)
    assert isinstance(won, Acquired)
    clock = VirtualClock(1000.0)
    progress = Progress(clock)
    progress.enter("call_ai", StageBudget(max_no_progress=20))
    events: list[Event] = []
    timings = LeaseTimings(
        ttl=30, renew_interval=5, op_timeout=1, self_fence_margin=2, stall_after_misses=misses
    )
    keeper = LeaseKeeper(
        store,
        won.fence,
        progress,
        timings,
        valid_until=clock() + 30,
        stall_policy=policy,
        on_event=events.append,
    )
    return keeper, progress, clock, events


async def test_renews_with_stage_and_version_while_progressing(store: SQLiteStore) -> None:
    """Progress within budget: the keeper renews, sending stage and progress version."""
    keeper, progress, clock, events = await _keeper(store)
    clock.now += 5
    progress.progress("chunk 1")
    await keeper.tick()
    job = await store.get("job")
    assert job is not None and job.stage == "call_ai" and job.progress_version == progress.version
    assert [e.kind for e in events] == ["renewed"]
    assert keeper.valid_until == pytest.approx(clock.now + 30)


async def test_seed_timeline_stops_renewing_past_budget(store: SQLiteStore) -> None:
    """The seed's section 6: renew at idle 5, 10, 15, 20 s; refuse at 25 s (budget 20 s)."""
    keeper, _, clock, events = await _keeper(store)
    for _ in range(4):
        clock.now += 5
        await keeper.tick()
    assert [e.kind for e in events] == ["renewed"] * 4
    clock.now += 5
    with pytest.raises(Stalled) as info:
        await keeper.tick()
    assert info.value.idle_s == pytest.approx(25) and info.value.budget_s == 20
    assert [e.kind for e in events][-2:] == ["renew_skipped", "stalled"]


async def test_stall_needs_consecutive_misses(store: SQLiteStore) -> None:
    """With stall_after_misses=3, two skipped renewals are not yet a stall; progress resets."""
    keeper, progress, clock, events = await _keeper(store, misses=3)
    clock.now += 21
    await keeper.tick()
    await keeper.tick()
    assert keeper.misses == 2
    progress.progress("moved")
    await keeper.tick()
    assert keeper.misses == 0 and events[-1].kind == "renewed"
    clock.now += 21
    for _ in range(2):
        await keeper.tick()
    with pytest.raises(Stalled):
        await keeper.tick()


async def test_expire_stall_stores_snapshot_and_keeps_lease_to_lapse(store: SQLiteStore) -> None:
    """expire: the snapshot lands in the record, nothing is released, the lease lapses."""
    keeper, _, clock, _ = await _keeper(store)

    async def stuck_somewhere() -> None:
        await asyncio.Event().wait()

    keeper.work = asyncio.create_task(stuck_somewhere())
    await asyncio.sleep(0)
    clock.now += 21
    with pytest.raises(Stalled):
        await keeper.tick()
    keeper.work.cancel()
    job = await store.get("job")
    assert job is not None and job.status is Status.RUNNING and job.lease_live
    assert job.stall_snapshot is not None and "stuck_somewhere" in job.stall_snapshot
    assert isinstance(await store.acquire("job", "B", ttl=30, max_no_progress=5), Following)


async def test_release_stall_steps_down_at_once(store: SQLiteStore) -> None:
    """release: a stalled owner steps down, so a follower acquires without waiting a TTL."""
    keeper, _, clock, _ = await _keeper(store, StallPolicy.RELEASE)
    clock.now += 21
    with pytest.raises(Stalled):
        await keeper.tick()
    job = await store.get("job")
    assert (
        job is not None and job.status is Status.PENDING and "no progress" in (job.last_error or "")
    )
    assert isinstance(await store.acquire("job", "B", ttl=30, max_no_progress=5), Acquired)


async def test_alert_keeps_renewing_and_records_once(store: SQLiteStore) -> None:
    """alert: a stalled job keeps its lease; the stall is recorded once per episode."""
    keeper, _, clock, events = await _keeper(store, StallPolicy.ALERT)
    for _ in range(8):  # idle 5, 10, ... 40 s against a 20 s budget, renewed every 5 s
        clock.now += 5
        await keeper.tick()
    kinds = [e.kind for e in events]
    assert kinds.count("stalled") == 1 and kinds.count("renewed") == 8
    job = await store.get("job")
    assert job is not None and job.lease_live and job.stall_snapshot


@pytest.mark.parametrize("policy", list(StallPolicy))
async def test_on_stall_makes_the_stored_snapshot(store: SQLiteStore, policy: StallPolicy) -> None:
    """Under every policy the snapshot stored for a stall is what ``on_stall`` returns,
    given the keeper's own text and the idle seconds (process isolation's hook)."""
    keeper, _, clock, _ = await _keeper(store, policy)
    seen: list[tuple[str, float]] = []

    async def child_stacks(text: str, idle: float) -> str:
        seen.append((text, idle))
        return f"{text.splitlines()[0]}\nthe child's stacks"

    keeper.on_stall = child_stacks
    clock.now += 21
    if policy is StallPolicy.ALERT:
        await keeper.tick()
    else:
        with pytest.raises(Stalled):
            await keeper.tick()
    job = await store.get("job")
    assert job is not None and (job.stall_snapshot or "").endswith("\nthe child's stacks")
    ((text, idle),) = seen
    assert idle == pytest.approx(21) and "no progress" in text


async def test_refused_renewal_raises_lease_lost(store: SQLiteStore) -> None:
    """A renewal the store refuses (another owner took over) stops the work at once."""
    keeper, _, clock, events = await _keeper(store)
    await store.release(keeper.fence)
    assert isinstance(await store.acquire("job", "B", ttl=30, max_no_progress=5), Acquired)
    clock.now += 5
    with pytest.raises(LeaseLost, match="not_owner"):
        await keeper.tick()
    assert events[-1].kind == "renew_refused"


async def test_a_refusal_met_after_the_commit_landed_stops_nothing(store: SQLiteStore) -> None:
    """A renewal refused because the owner's own commit landed first (``not_running``): once
    the commit is on its way its answer decides, so the refusal is reported, never raised."""
    keeper, _, clock, events = await _keeper(store)
    keeper.commit_started()
    await store.commit(keeper.fence, '"the answer"')
    clock.now += 5
    await keeper.tick()  # before the fix: LeaseLost (not_running), cancelling the commit
    assert events[-1].kind == "renew_refused" and "not_running" in events[-1].detail


async def test_after_the_commit_started_the_keeper_sends_no_renewal(store: SQLiteStore) -> None:
    """The run loop parks once the commit is being sent: no renewal goes out after it."""
    keeper, _, clock, events = await _keeper(store)
    keeper.commit_started()
    clock.now += 6  # a renewal is due
    run = asyncio.create_task(keeper.run())
    # real: the keeper's store is SQLite, which answers from a thread (no virtual loop)
    await asyncio.sleep(0.05)
    assert not run.done() and not [e for e in events if e.kind.startswith("renew")]
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


class UnreachableStore(SQLiteStore):
    """A real store whose renewals fail as if the network were down."""

    async def renew(self, fence: Fence, **kw: object) -> Renewal:  # type: ignore[override]
        raise StoreUnavailable(self.where, "renew", "connection refused")


async def test_unreachable_store_self_fences_before_lapse(tmp_path: Path) -> None:
    """Store unreachable: the owner keeps working until ttl - margin, then stops itself."""
    store = UnreachableStore(tmp_path / "u.db")
    try:
        keeper, progress, clock, events = await _keeper(store)
        for i in range(5):
            clock.now += 5
            progress.progress(i)
            await keeper.tick()
            keeper.ensure_lease()
        assert [e.kind for e in events] == ["renew_failed"] * 5
        clock.now += 2.99  # 27.99 s since the lease was granted; fence at 28 s
        keeper.ensure_lease()
        clock.now += 0.02
        with pytest.raises(LeaseLost, match="self-fenced"):
            keeper.ensure_lease()
    finally:
        await store.aclose()


async def test_run_loop_stops_a_blocked_owner_on_wake(store: SQLiteStore) -> None:
    """If the loop was blocked past the self-fence point, the keeper's loop raises on wake."""
    keeper, _, clock, _ = await _keeper(store)
    keeper.timings = LeaseTimings(ttl=30, renew_interval=0.05, op_timeout=0.01, self_fence_margin=2)
    clock.now += 29  # as if a sync sleep had blocked everything for 29 s
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(keeper.run(), 5)


# -- the keeper beside the work (lease.keeper.alongside) -------------------------------------


async def _short_lived_keeper(
    store: SQLiteStore, store_for_keeper: object = None, valid_for: float = 0.3
) -> LeaseKeeper:
    """A real keeper whose lease is good for ``valid_for`` s more (self-fence 0.2 s before);
    its first renewal is due after 0.4 s."""
    won = await store.acquire("job", "A", ttl=30, max_no_progress=5)
    assert isinstance(won, Acquired)
    progress = Progress()
    timings = LeaseTimings(ttl=1.0, renew_interval=0.4, op_timeout=0.1, self_fence_margin=0.2)
    return LeaseKeeper(
        store_for_keeper or store,  # type: ignore[arg-type]
        won.fence,
        progress,
        timings,
        valid_until=progress.clock() + valid_for,
    )


async def test_keeper_failure_wins_even_if_the_work_swallows_its_cancellation(
    store: SQLiteStore,
) -> None:
    """A stage that turns cancellation into a fallback answer cannot keep a lost lease: the
    keeper's error is raised, and the task is not left counting a cancellation."""
    keeper = await _short_lived_keeper(store)

    async def stubborn() -> str:
        try:  # real, never waited out: the keeper on the SQLite store (a thread) stops it
            await asyncio.sleep(5)
            return "full answer"
        except asyncio.CancelledError:
            return "fallback answer"

    with pytest.raises(LeaseLost, match="self-fenced"):
        await alongside(stubborn(), keeper)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_keeper_ended_by_a_stray_cancellation_stops_the_work(store: SQLiteStore) -> None:
    """Fault injection: a store call that raises CancelledError (nobody cancelled the keeper)
    ends the keeper; the work must not go on without anyone keeping its lease."""

    class StrayCancel:
        def __getattr__(self, name: str) -> object:
            async def op(*args: object, **kwargs: object) -> None:
                raise asyncio.CancelledError

            return op

    keeper = await _short_lived_keeper(store, StrayCancel(), valid_for=5.0)
    started = asyncio.get_running_loop().time()
    with pytest.raises(LeaseLost, match="keeper stopped"):
        await alongside(asyncio.sleep(5), keeper)  # real, cut short: SQLite answers from a thread
    assert asyncio.get_running_loop().time() - started < 1.0


# -- lease timings that cannot work (issue 12, item 0c) ---------------------------------------


def test_timings_whose_first_renewal_is_due_after_the_self_fence_point_are_refused() -> None:
    """ttl 6, renew 3, op 2, margin 2: the owner would self-fence at 4 s before its first
    renewal could land (3 + 2 s): refused, in the value object and in Settings, with the
    numbers."""
    from ai_lease import ConfigError
    from ai_lease.settings import Settings

    numbers = r"renew_interval 3s .* ttl - op_timeout - self_fence_margin = 6 - 2 - 2 = 2s"
    with pytest.raises(ConfigError, match=numbers):
        LeaseTimings(ttl=6, renew_interval=3, op_timeout=2, self_fence_margin=2)
    with pytest.raises(ConfigError, match=r"lease\.renew_interval: .*" + numbers):
        Settings(lease={"ttl": 6, "renew_interval": 3})
    LeaseTimings(ttl=8, renew_interval=3, op_timeout=2, self_fence_margin=2)  # 4 s: fine


# -- a stopped process wakes up (issue 12, item E) -------------------------------------------


class _RenewalsFail:
    """The real store, except that no renewal gets through."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def renew(self, *args: object, **kwargs: object) -> Renewal:
        raise StoreUnavailable("test", "renew", "unreachable")


async def test_after_a_stall_the_self_fence_not_the_stream_timeout_ends_the_work(
    store: SQLiteStore,
) -> None:
    """The loop is blocked (as by SIGSTOP) past both the self-fence point and the stream's
    idle timeout: the attempt ends for the lost lease (the stream timeout as its cause), and
    the keeper's LeaseLost is never left unretrieved in a task."""
    import gc
    import time

    from ai_lease import StreamIdleTimeout

    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    try:
        # Self-fence at 0.8 s (renewals fail from 0.4 s on); the idle timeout at 0.85 s.
        keeper = await _short_lived_keeper(store, _RenewalsFail(store), valid_for=1.0)

        async def stream() -> str:  # real: the stall below is a real time.sleep of the loop
            await asyncio.sleep(0.85)
            raise StreamIdleTimeout(0.85)

        loop.call_later(0.6, time.sleep, 0.6)  # the process is stopped from 0.6 s to 1.2 s
        with pytest.raises(LeaseLost, match="self-fenced") as raised:
            await alongside(stream(), keeper)
        assert isinstance(raised.value.__cause__, StreamIdleTimeout)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        del raised, keeper
        await asyncio.sleep(0.05)  # let every done callback run (real: SQLite's thread)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert not unretrieved, unretrieved
