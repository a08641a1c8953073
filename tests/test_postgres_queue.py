"""The PostgreSQL queue's own side: the claim (``FOR UPDATE SKIP LOCKED``) raced by several
OS processes at one instant, what a claim hides and from whom, and the admin calls' edges.

The contracts (queue, history, admin, listing) run on PostgreSQL through the ``store``
fixture; these pin what only this store does.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ai_lease.errors import CorruptRecord
from ai_lease.job import Status
from ai_lease.stores.postgres import queue as postgres_queue
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer

PROCESSES, JOBS, LIMIT = 4, 40, 16


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_q_{secrets.token_hex(4)}"
    yield name
    pg_server.reset(name)


async def _open(url: str, namespace: str) -> PostgresStore:
    store = PostgresStore(url, namespace=namespace, op_timeout=5.0)
    await store.due_recoveries(1)  # connected and migrated: the race is the claim alone
    return store


@pytest.fixture
async def queue(pg_server: PostgresServer, namespace: str) -> AsyncIterator[PostgresStore]:
    store = await _open(pg_server.url, namespace)
    yield store
    await store.aclose()


# -- the claim raced by several OS processes ----------------------------------------------------


Handed = tuple[list[str], float, float]  # keys, when the call started, when it ended


def _claimant(url: str, namespace: str, hold: float, barrier: Any, out: Any) -> None:
    """One worker process: its own store, one due() at the barrier's instant."""
    postgres_queue.CLAIM_HOLD = hold

    async def main() -> Handed:
        store = await _open(url, namespace)
        try:
            barrier.wait(timeout=30)
            started = time.time()
            keys = await store.due(LIMIT)
            return keys, started, time.time()
        finally:
            await store.aclose()

    out.put(asyncio.run(main()))


def _race(url: str, namespace: str, hold: float) -> list[Handed]:
    """PROCESSES processes calling due() at one instant; what each was handed, and when."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    args = (url, namespace, hold, barrier, out)
    procs = [ctx.Process(target=_claimant, args=args) for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    try:
        return [out.get(timeout=60) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)


def _assert_disjoint(handed: list[Handed], keys: list[str], hold: float) -> None:
    """No key handed to two processes whose calls were within ``hold`` of each other (the
    same instant, for a claim), and every key handed to someone."""
    seen: dict[str, int] = {}
    for n, (got, started, ended) in enumerate(handed):
        for key in got:
            if key in seen:
                _, other_started, other_ended = handed[seen[key]]
                apart = max(ended, other_ended) - min(started, other_started)
                assert apart >= hold, f"{key} handed to processes {seen[key]} and {n}"
            seen[key] = n
    assert sorted(seen) == sorted(keys), "a due key was handed to nobody"


HOLDS = [postgres_queue.CLAIM_HOLD, 30.0]  # the default; one no scheduler jitter outlasts


@pytest.mark.parametrize("hold", HOLDS, ids=["default-hold", "long-hold"])
async def test_processes_claiming_at_one_instant_get_disjoint_keys(
    pg_server: PostgresServer, namespace: str, queue: PostgresStore, hold: float
) -> None:
    """Four processes, each its own store, call due() at the same instant on 40 due jobs:
    no key is handed to two of them, and every one is handed to someone."""
    keys = [f"race-{n:02}" for n in range(JOBS)]
    for key in keys:
        await queue.submit(key, "{}", "fp")
    handed = await asyncio.to_thread(_race, pg_server.url, namespace, hold)
    _assert_disjoint(handed, keys, hold)
    assert sum(bool(got) for got, _, _ in handed) >= 3, f"fewer than 3 took all: {handed}"


@pytest.mark.parametrize("hold", HOLDS, ids=["default-hold", "long-hold"])
async def test_processes_claiming_lapsed_leases_get_disjoint_keys(
    pg_server: PostgresServer, namespace: str, queue: PostgresStore, hold: float
) -> None:
    """The lapsed leases (looked at first) are claimed the same way: one process each."""
    keys = [f"lapsed-{n:02}" for n in range(JOBS)]
    for key in keys:
        await queue.submit(key, "{}", "fp")
        await queue.reschedule(key, 1e12)  # far ahead: only the lapse makes it due
    _lapse(pg_server, namespace, keys)
    handed = await asyncio.to_thread(_race, pg_server.url, namespace, hold)
    _assert_disjoint(handed, keys, hold)


def _lapse(pg: PostgresServer, namespace: str, keys: list[str]) -> None:
    """The jobs RUNNING under leases that lapsed a second ago, the first key's earliest."""
    pg.execute(
        f"UPDATE \"{namespace}\".ail_jobs SET status = 'RUNNING', owner_id = 'dead',"
        " lease_expires_at = extract(epoch FROM clock_timestamp()) - 1"
        " + array_position(%s::text[], key) * 0.001 WHERE key = ANY(%s)",
        (keys, keys),
    )


# -- what a claim hides, from whom, and for how long ------------------------------------------


async def test_a_claim_hides_a_key_from_other_stores_for_the_hold_only(
    pg_server: PostgresServer,
    namespace: str,
    queue: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key one store was handed is not due for another until the hold ends; the store
    that claimed it still sees it; a reschedule ends the claim for everyone."""
    monkeypatch.setattr(postgres_queue, "CLAIM_HOLD", 1.0)  # longer than a loaded box's pause
    other = await _open(pg_server.url, namespace)
    try:
        await queue.submit("held", "{}", "fp")
        await queue.submit("moved", "{}", "fp")
        assert sorted(await queue.due(10)) == ["held", "moved"]
        assert await other.due(10) == []
        assert sorted(await queue.due(10)) == ["held", "moved"]  # its own claims
        await queue.reschedule("moved", 0.0)
        assert await other.due(10) == ["moved"]
        assert await queue.due(10) == ["held"]  # "moved" is the other's claim now
        await asyncio.sleep(postgres_queue.CLAIM_HOLD + 0.2)
        assert await other.due(10) == ["held", "moved"]
    finally:
        await other.aclose()


async def test_a_lapsed_lease_comes_first_and_is_claimed(
    pg_server: PostgresServer,
    namespace: str,
    queue: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lapsed RUNNING job with a queue entry far ahead is due before fresh work, the
    earliest lapse first; once claimed, another store is not handed it."""
    monkeypatch.setattr(postgres_queue, "CLAIM_HOLD", 5.0)
    for key in ("fresh-1", "fresh-2", "late-lapse", "early-lapse"):
        await queue.submit(key, "{}", "fp")
    for key in ("late-lapse", "early-lapse"):
        await queue.reschedule(key, 1e12)
    _lapse(pg_server, namespace, ["early-lapse", "late-lapse"])
    assert await queue.due(3) == ["early-lapse", "late-lapse", "fresh-1"]
    other = await _open(pg_server.url, namespace)
    try:
        assert await other.due(10) == ["fresh-2"]
    finally:
        await other.aclose()


# -- the admin calls' edges ---------------------------------------------------------------------


async def test_a_record_that_is_not_ours_is_left_as_it_is(
    pg_server: PostgresServer, namespace: str, queue: PostgresStore
) -> None:
    """A record of an unknown status raises CorruptRecord on submit, retry and remove, and
    none of them changes it or its queue entry; prune passes it over."""
    await queue.submit("foreign", "{}", "fp")
    table = f'"{namespace}".ail_jobs'
    pg_server.execute(f"UPDATE {table} SET status = 'BOGUS', spec = NULL WHERE key = 'foreign'")
    pg_server.execute(f'DELETE FROM "{namespace}".ail_queue')
    with pytest.raises(CorruptRecord):
        await queue.submit("foreign", "{}", "fp")
    with pytest.raises(CorruptRecord):
        await queue.retry("foreign")
    with pytest.raises(CorruptRecord):
        await queue.remove("foreign", force=True)
    assert await queue.prune(0.0) == 0
    assert pg_server.execute(f"SELECT status, spec FROM {table}") == [("BOGUS", None)]
    assert pg_server.execute(f'SELECT count(*) FROM "{namespace}".ail_queue') == [(0,)]


async def test_prune_goes_batch_by_batch(
    pg_server: PostgresServer,
    namespace: str,
    queue: PostgresStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More old jobs than one batch holds are all pruned (a statement per batch), with their
    queue entries and timelines."""
    monkeypatch.setattr(postgres_queue, "PRUNE_BATCH", 3)
    keys = [f"old-{n}" for n in range(8)]
    for key in keys:
        await queue.submit(key, "{}", "fp")
    pg_server.execute(
        f"UPDATE \"{namespace}\".ail_jobs SET status = 'DONE', updated_at = updated_at - 10"
    )
    assert await queue.prune(5.0) == len(keys)
    for table in ("ail_jobs", "ail_queue"):
        assert pg_server.execute(f'SELECT count(*) FROM "{namespace}".{table}') == [(0,)]


async def test_durations_added_at_once_by_many_tasks_add_up(queue: PostgresStore) -> None:
    """Concurrent add_durations calls over the same buckets (in any order) all count."""
    series = [("p", "stage", f"s{n}") for n in range(5)]

    async def add(order: int) -> None:
        picked = series if order % 2 else series[::-1]
        await queue.add_durations({s: {1: 1, 7: 2} for s in picked})

    await asyncio.gather(*(add(n) for n in range(20)))
    loaded = await queue.load_durations()
    assert all(loaded[s] == {1: 20, 7: 40} for s in series)


async def test_gauges_count_in_one_statement(
    pg_server: PostgresServer, namespace: str, queue: PostgresStore
) -> None:
    """One statement counts jobs per status, due and later entries, live and lapsed leases."""
    for key in ("a", "b", "c", "d"):
        await queue.submit(key, "{}", "fp")
    await queue.reschedule("b", 1e12)
    _lapse(pg_server, namespace, ["c"])
    pg_server.execute(
        f"UPDATE \"{namespace}\".ail_jobs SET status = 'RUNNING', lease_expires_at = 1e12"
        " WHERE key = 'd'"
    )
    gauges = await queue.gauges()
    assert gauges.jobs is not None
    assert {s: n for s, n in gauges.jobs.items() if n} == {"PENDING": 2, "RUNNING": 2}
    assert set(gauges.jobs) == {s.value for s in Status}  # every status, 0 where none
    assert (gauges.queue_due, gauges.queue_scheduled) == (3, 1)
    assert (gauges.leases_live, gauges.leases_lapsed) == (1, 1)
