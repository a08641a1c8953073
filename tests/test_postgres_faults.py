"""PostgreSQL faults on a cluster of this module's own: the server killed and restarted under
a running job, a connection cut with ``pg_terminate_backend`` in the middle of an acquire
and of a commit, a statement stalled behind another session's lock, a frozen server.

The restart runs real chaos nodes (tests/harness/chaos_node.py, the fast profile of
tests/chaos: lease 2 s, renewal 0.5 s, op timeout 0.4 s); the rest drive a store in this
process, with a second session (psycopg, autocommit off) holding the lock a store call
waits for, so the fault lands while that call is on the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ai_lease.errors import FencingRejected, StoreUnavailable
from ai_lease.job import Status
from ai_lease.lease.base import Acquired, Fence, Following, Renewal
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, report
from tests.harness.history import of_kind, read_record
from tests.harness.pg_server import PostgresServer

REAL_TIME = "a PostgreSQL server of its own, killed and restarted"


pytestmark = pytest.mark.postgres

OP = 1.0  # the in-process stores' op_timeout
SLACK = 1.0  # generous: two CPUs shared with other test runs
TTL = PROFILE["ttl"]
KEY = "pg-job"

THAW_AFTER_S = OP + 2 * SLACK + 8  # the pause's end when the store does not come back by itself


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """A cluster of this module's own: these tests kill, freeze and restart it."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def url(pg: PostgresServer) -> str:
    pg.resume()
    if not pg.running:
        pg.start()
    pg.terminate_backends()
    pg.reset_all()
    return pg.url


@pytest.fixture
async def store(url: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore.from_url(url, op_timeout=OP)
    yield opened
    await opened.aclose()


async def _own(store: PostgresStore, key: str, owner: str, ttl: float = 30.0) -> Fence:
    outcome = await store.acquire(key, owner, ttl=ttl, max_no_progress=30.0)
    assert isinstance(outcome, Acquired), outcome
    return outcome.fence


@asynccontextmanager
async def _locked(url: str, lock_sql: str, params: tuple[Any, ...] = ()) -> AsyncIterator[None]:
    """Another session holding a lock (its transaction open) until the block ends."""
    async with await psycopg.AsyncConnection.connect(url) as other:
        await other.execute(lock_sql, params)
        yield
        await other.rollback()


def _row_lock(key: str) -> tuple[str, tuple[str]]:
    return "SELECT 1 FROM ai_lease.ail_jobs WHERE key = %s FOR UPDATE", (key,)


async def _blocked_backend(pg: PostgresServer, function: str) -> int:
    """The pid of the backend running ``function`` while it waits for a lock."""
    query = (
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s"
        " AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + 5
    while not (rows := await asyncio.to_thread(pg.execute, query, (f"%{function}%",))):
        assert time.monotonic() < deadline, f"no backend waits in {function}"
        await asyncio.sleep(0.01)
    return int(rows[0][0])


async def _cut_while_blocked(pg: PostgresServer, key: str, function: str, call: Any) -> Any:
    """Run ``call`` while ``key``'s row is locked; once it waits on the server, terminate its
    backend, then let the lock go. The store's answer (its resend's) is returned."""
    async with _locked(pg.url, *_row_lock(key)):
        task = asyncio.ensure_future(call)
        pid = await _blocked_backend(pg, function)
        assert pg.execute("SELECT pg_terminate_backend(%s)", (pid,)) == [(True,)]
    return await asyncio.wait_for(task, OP + SLACK)


async def _renew(store: PostgresStore, fence: Fence) -> Renewal:
    return await store.renew(
        fence, ttl=30.0, stage="s", progress_version=1, max_no_progress=30.0, grace=0.0
    )


async def _acquisitions(store: PostgresStore, key: str, owner: str) -> list[int]:
    entries, _ = await store.timeline(key)
    kinds = ("acquired", "taken_over")
    return [e.token for e in entries if e.kind in kinds and e.owner_id == owner]


async def test_connection_cut_during_acquire_is_resent_without_an_orphan(
    pg: PostgresServer, store: PostgresStore
) -> None:
    """pg_terminate_backend on the acquire's connection while it is on the server: the
    store resends, the owner gets one lease, and it can commit at once (no TTL waited)."""
    seed = await _own(store, KEY, "seed")
    assert await store.release(seed)
    started = time.monotonic()
    outcome = await _cut_while_blocked(
        pg, KEY, "ail_acquire", store.acquire(KEY, "A", ttl=30.0, max_no_progress=30.0)
    )
    assert isinstance(outcome, Acquired) and outcome.fence.owner_id == "A"
    assert outcome.fence.token > seed.token
    assert await _acquisitions(store, KEY, "A") == [outcome.fence.token]
    again = await store.acquire(KEY, "A", ttl=30.0, max_no_progress=30.0)
    assert isinstance(again, Acquired) and again.fence == outcome.fence
    other = await store.acquire(KEY, "B", ttl=30.0, max_no_progress=30.0)
    assert isinstance(other, Following) and other.owner_id == "A"
    done = await store.commit(outcome.fence, "answer")
    assert done.status is Status.DONE and time.monotonic() - started < OP + SLACK


async def test_connection_cut_during_commit_leaves_one_result(
    pg: PostgresServer, store: PostgresStore
) -> None:
    """pg_terminate_backend on the commit's connection while it waits on the server, then
    every connection cut after a commit landed: each retry answers with the one stored
    result, and the timeline holds one commit."""
    fence = await _own(store, KEY, "A")
    done = await _cut_while_blocked(pg, KEY, "ail_finish", store.commit(fence, "the answer"))
    assert done.status is Status.DONE and done.result == "the answer"
    assert pg.terminate_backends() >= 1  # the pool's connections: all stale now
    again = await asyncio.wait_for(store.commit(fence, "a second answer"), OP + SLACK)
    assert again.result == "the answer"
    with pytest.raises(FencingRejected):
        await store.commit(Fence(KEY, "B", fence.token + 1), "an imposter")
    entries, _ = await store.timeline(KEY)
    assert [e.kind for e in entries].count("committed") == 1
    record = await store.get(KEY)
    assert record is not None and record.token == fence.token and record.result == "the answer"


@pytest.mark.parametrize(
    "lock",
    [
        pytest.param(_row_lock(KEY), id="row-lock"),
        pytest.param(("LOCK TABLE ai_lease.ail_jobs IN ACCESS EXCLUSIVE MODE", ()), id="table"),
    ],
)
async def test_a_statement_stalled_by_a_lock_is_bounded_by_op_timeout(
    url: str, store: PostgresStore, lock: tuple[str, tuple[Any, ...]]
) -> None:
    """Another session holds the lock a renewal (and a read) needs: each returns
    StoreUnavailable within about op_timeout, never hangs; once the lock goes, both work."""
    fence = await _own(store, KEY, "A")
    async with _locked(url, *lock):
        for name, call in (
            ("renew", lambda: _renew(store, fence)),
            ("commit", lambda: store.commit(fence, "blocked")),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await asyncio.wait_for(call(), OP + 2 * SLACK)
            elapsed = time.monotonic() - started
            assert elapsed < OP + SLACK, f"{name} took {elapsed:.2f}s with op_timeout {OP}"
    assert (await _renew(store, fence)).ok
    record = await store.get(KEY)
    assert record is not None and record.status is Status.RUNNING and record.result is None


async def test_a_frozen_server_is_bounded_by_op_timeout(
    pg: PostgresServer, store: PostgresStore
) -> None:
    """The server SIGSTOPped: a read on a pooled connection gets no answer and returns
    StoreUnavailable within about op_timeout; after SIGCONT the store works again."""
    fence = await _own(store, KEY, "A")
    # Another process ends the pause: a store call that blocked this interpreter (psycopg
    # 3.2's cancel request to a frozen server holds the GIL) must fail the test, not hang it.
    pg.pause(for_s=THAW_AFTER_S)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.get(KEY), THAW_AFTER_S + 10)
        elapsed = time.monotonic() - started
        assert elapsed < OP + SLACK, f"get took {elapsed:.2f}s with op_timeout {OP}"
    finally:
        pg.resume()
    record = await store.get(KEY)
    assert record is not None and record.token == fence.token


async def test_server_restarted_mid_job_loses_nothing(
    url: str, pg: PostgresServer, tmp_path: Path
) -> None:
    """The server SIGKILLed under a running job and started again after more than a TTL:
    the record is still there, the owner fenced itself while the server was down, the job
    is run again under a higher token and ends DONE with one result."""
    async with ChaosCluster(url, tmp_path) as cluster:
        b = await cluster.start_ready("B", [KEY])
        a = await cluster.start("A", [KEY], calls="slow", slow_for=4.0, chunks=8)
        await a.wait_for_event("acquired", "A to own the job")
        cluster.go()
        await a.wait_for(
            lambda evs: [e for e in of_kind(evs, "renewed") if e["stage"] == "call_ai"][1:],
            "2 renewals while streaming",
            timeout=10,
        )
        before = await read_record(url, KEY)
        assert before is not None and before.status is Status.RUNNING
        pg.kill()
        down_at = time.time()
        await asyncio.sleep(TTL + 1.0)  # the outage's length, not a pass/fail decision
        await asyncio.to_thread(pg.start)
        kept = await read_record(url, KEY)
        assert kept is not None and kept.token >= before.token, "the restart lost the record"
        codes = {node.name: await node.exited(30) for node in (a, b)}
        histories = cluster.histories()
        verdict = await check_job(url, KEY, histories, ttl=TTL)
    assert of_kind(histories["A"], "self_fenced"), f"A kept working: {histories['A']}"
    assert verdict.record.token > before.token, "no higher token after the restart"
    assert codes["A"] == 0, cluster.dump()
    for error in verdict.errors.values():  # a follower may give up while the server is down
        assert error.startswith("StoreUnavailable: ") and "during acquire" in error, error
    after = [e for e in verdict.acquisitions if e["at"] > down_at]
    report(
        "postgres killed 3s, restarted",
        url,
        reacquired_after=after[0]["at"] - down_at if after else -1.0,
        done_after=verdict.committer["at"] - down_at,
    )
