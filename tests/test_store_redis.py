"""Redis-specific behaviour: restarts without persistence, corrupt keys, unreachable and
black-holed servers, lost replies, one round trip per operation, one hash slot per job."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from ai_lease import (
    ConfigError,
    CorruptRecord,
    Fence,
    FencingRejected,
    Following,
    OutcomeUnknown,
    StoreDataLost,
    StoreUnavailable,
)
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.lease.queue import WorkerInfo
from ai_lease.stores import open_store
from ai_lease.stores.redis import scripts as lua
from ai_lease.stores.redis.store import RedisStore
from tests.harness.chaos_proxy import ChaosProxy, script_sha
from tests.harness.redis_server import RedisServer, free_port
from tests.harness.tcp_proxy import FaultProxy

REAL_TIME = "a socket to a real redis-server; leases lapse on its clock"


@pytest.fixture
async def rstore(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=0.5)
    yield store
    await store.aclose()


async def test_tokens_keep_increasing_across_restart_without_persistence() -> None:
    """A redis-server restarted with all data lost still issues larger tokens than before."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, op_timeout=2.0)
        try:
            before = await store.acquire("job", "A", ttl=30, max_no_progress=5)
            assert isinstance(before, Acquired)
            server.restart()
            assert await store.get("job") is None, "the restart really lost the record"
            after = await store.acquire("job", "B", ttl=30, max_no_progress=5)
            assert isinstance(after, Acquired) and after.fence.token > before.fence.token
            with pytest.raises(FencingRejected, match=r"stale|no record"):
                await store.commit(before.fence, "from before the restart")
            assert (await store.commit(after.fence, "ok")).result == "ok"
        finally:
            await store.aclose()


@pytest.mark.parametrize(
    "plant",
    [
        lambda r, k: r.set(k, "a plain string"),
        lambda r, k: r.hset(k, mapping={"status": "RUNNING", "token": "1"}),
        lambda r, k: r.hset(k, mapping={"schema": "1", "status": "RUNNING", "token": "x"}),
        lambda r, k: r.hset(k, mapping={"schema": "7", "status": "RUNNING"}),
    ],
    ids=["string", "no-schema", "bad-token", "future-schema"],
)
async def test_corrupt_value_is_named_and_left_alone(
    redis_server: RedisServer, rstore: RedisStore, plant: object
) -> None:
    """A foreign value under a job's key raises CorruptRecord naming the job; nothing changes."""
    sync = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        good = await rstore.acquire("good", "A", ttl=30, max_no_progress=5)
        assert isinstance(good, Acquired)
        bad_key = rstore.keys("bad")[0]
        plant(sync, bad_key)  # type: ignore[operator]
        before = sync.dump(bad_key)
        ops = (
            lambda: rstore.get("bad"),
            lambda: rstore.acquire("bad", "B", ttl=30, max_no_progress=5),
            lambda: rstore.commit(Fence("bad", "B", 1), "r"),
            lambda: rstore.release(Fence("bad", "B", 1)),
        )
        for op in ops:
            with pytest.raises(CorruptRecord, match="'bad'"):
                await op()
        assert sync.dump(bad_key) == before
        job = await rstore.get("good")
        assert job is not None and job.owner_id == "A"
    finally:
        sync.close()


async def test_unreachable_server_fails_fast_with_masked_url() -> None:
    """Nobody listening: StoreUnavailable within the op timeout, password masked."""
    url = f"redis://:sk-CANARY-pw@127.0.0.1:{free_port()}/0"
    store = RedisStore.from_url(url, op_timeout=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await store.acquire("k", "A", ttl=30, max_no_progress=5)
        assert time.monotonic() - started < 1.5
        assert "CANARY" not in str(info.value) and "***" in str(info.value)
    finally:
        await store.aclose()


async def test_black_holed_server_ends_at_op_timeout(redis_server: RedisServer) -> None:
    """A connection that swallows everything ends each operation at op_timeout, never hangs."""
    async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        store = RedisStore.from_url(proxy.url_for(), op_timeout=0.4)
        try:
            won = await store.acquire("k", "A", ttl=30, max_no_progress=5)
            assert isinstance(won, Acquired)
            proxy.black_hole()
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match="renew"):
                    await store.renew(
                        won.fence, ttl=30, stage="s", progress_version=1, max_no_progress=5, grace=1
                    )
                assert time.monotonic() - started < 1.0
            proxy.heal()
            answer = await store.renew(
                won.fence, ttl=30, stage="s", progress_version=1, max_no_progress=5, grace=1
            )
            assert answer.ok
        finally:
            await store.aclose()


async def test_lost_acquire_reply_is_recovered_by_retrying(redis_server: RedisServer) -> None:
    """A dropped acquire reply leaves no orphan lease: the retry returns the same token."""
    async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        store = RedisStore.from_url(proxy.url_for(), op_timeout=0.5)
        try:
            await store.get("warm-up")
            proxy.drop_replies_then_close()
            with pytest.raises(StoreUnavailable):
                await store.acquire("lost", "A", ttl=30, max_no_progress=5)
            proxy.heal()
            job = await store.get("lost")
            assert job is not None and job.owner_id == "A", "the acquire did happen"
            again = await store.acquire("lost", "A", ttl=30, max_no_progress=5)
            assert isinstance(again, Acquired) and again.fence.token == job.token
            other = await store.acquire("lost", "B", ttl=30, max_no_progress=5)
            assert isinstance(other, Following)
            proxy.drop_replies_then_close()
            with pytest.raises(StoreUnavailable):
                await store.commit(again.fence, "result")
            proxy.heal()
            assert (await store.commit(again.fence, "result")).result == "result"
        finally:
            await store.aclose()


async def test_each_operation_is_one_round_trip(
    redis_server: RedisServer, rstore: RedisStore
) -> None:
    """acquire, renew, release, commit and get each cost exactly one EVALSHA."""
    sync = redis.Redis.from_url(redis_server.url)
    try:
        await rstore.get("warm")  # loads the scripts once
        await rstore.acquire("warm", "A", ttl=30, max_no_progress=5)
        sync.config_resetstat()

        won = await rstore.acquire("k", "A", ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        await rstore.renew(
            won.fence, ttl=30, stage="s", progress_version=1, max_no_progress=5, grace=1
        )
        await rstore.release(won.fence)
        won = await rstore.acquire("k", "A", ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        await rstore.commit(won.fence, "r")
        await rstore.get("k")
        stats = sync.info("commandstats")
        # Commands run inside a script are counted too; what the client sent is the EVALSHAs.
        assert stats["cmdstat_evalsha"]["calls"] == 6
        assert not {"cmdstat_eval", "cmdstat_script|load", "cmdstat_ping"} & stats.keys()
    finally:
        sync.close()


def test_job_keys_share_one_cluster_slot() -> None:
    """Every key of one job carries one hash tag, so each script touches one Cluster slot."""
    store = RedisStore(redis.asyncio.Redis(), namespace="ns")
    for key in ("plain", "with}brace", "{tagged}", "ünïcode key", "}abc", "}", "{}", "a%7Db"):
        slots = {key_slot(k.encode()) for k in store.keys(key)}
        assert len(slots) == 1, key
        assert store._key_of(store.keys(key)[0]) == key, "list_jobs reads the key back"


async def test_follower_wakes_on_commit_via_pubsub(rstore: RedisStore) -> None:
    """On Redis a waiting follower wakes on the commit event, not at the end of its poll."""
    won = await rstore.acquire("k", "A", ttl=30, max_no_progress=5)
    assert isinstance(won, Acquired)
    import asyncio

    async def commit_soon() -> None:
        await asyncio.sleep(0.3)
        await rstore.commit(won.fence, "r")

    async with asyncio.TaskGroup() as tg:
        tg.create_task(commit_soon())
        started = time.monotonic()
        await rstore.wait("k", timeout=10)
        assert time.monotonic() - started < 2.0


# -- the queue under latency (issue 12 A, B) ---------------------------------------------------

LATENCY, JITTER, OP_TIMEOUT = 0.1, 0.05, 0.4  # the chaos profile: 100 ms ± 50 ms each way


def _info(worker_id: str) -> WorkerInfo:
    return WorkerInfo(worker_id, "host", 1, 0, 1, 0.0, 0.0)


async def test_every_queue_call_stays_usable_under_latency(redis_server: RedisServer) -> None:
    """Behind 100 ± 50 ms of latency each way (op timeout 0.4 s), four workers' queue calls
    (submit, due, reschedule, worker_beat, list_workers) all succeed, round after round."""
    redis_server.flushall()
    async with FaultProxy("127.0.0.1", redis_server.port, seed=12) as proxy:
        proxy.delay(LATENCY, JITTER)  # before the first connection, too
        stores = [RedisStore.from_url(proxy.url_for(), op_timeout=OP_TIMEOUT) for _ in range(4)]
        failures: list[str] = []

        async def worker(n: int, store: RedisStore) -> None:
            for round_ in range(4):
                key = f"lat-{n}-{round_}"
                calls = [
                    lambda key=key: store.submit(key, '{"key": "x"}', "fp"),
                    lambda: store.due(8),
                    lambda key=key: store.reschedule(key, time.time() + 60),
                    lambda: store.worker_beat(_info(f"w{n}"), 5.0),
                    lambda: store.list_workers(),
                ]
                for call in calls:
                    try:
                        await call()
                    except StoreUnavailable as exc:
                        failures.append(str(exc))

        try:
            async with asyncio.TaskGroup() as tg:
                for n, store in enumerate(stores):
                    tg.create_task(worker(n, store))
        finally:
            for store in stores:
                await store.aclose()
    assert not failures, f"{len(failures)} of 80 queue calls failed, e.g. {failures[:3]}"


async def test_a_timeout_does_not_make_the_next_call_reconnect(redis_server: RedisServer) -> None:
    """One reply later than the op timeout: that call fails, the connection is kept for the
    late reply, and the next call succeeds on it (no new connection, no set-up round trip)."""
    async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        store = RedisStore.from_url(proxy.url_for(), op_timeout=OP_TIMEOUT)
        try:
            await store.due(1)
            proxy.delay(0.25)  # 0.5 s round trip
            with pytest.raises(StoreUnavailable, match="no answer"):
                await store.due(1)
            proxy.delay(0.05)
            connections = proxy.connections_total
            await store.reschedule("k", 1.0)
            await store.due(1)
            assert proxy.connections_total == connections, "the timeout cost a reconnect"
        finally:
            await store.aclose()


async def test_submit_under_latency_queues_every_pending_record(redis_server: RedisServer) -> None:
    """Detached submits behind 100 ± 50 ms of latency: every PENDING record has its queue
    entry, whether the caller got an answer or was told the outcome is unknown."""
    redis_server.flushall()
    async with FaultProxy("127.0.0.1", redis_server.port, seed=3) as proxy:
        proxy.delay(LATENCY, JITTER)
        store = RedisStore.from_url(proxy.url_for(), op_timeout=OP_TIMEOUT)
        try:
            for n in range(6):
                with contextlib.suppress(OutcomeUnknown):
                    await store.submit(f"sub-{n}", '{"key": "x"}', "fp")
        finally:
            await store.aclose()
    direct = RedisStore.from_url(redis_server.url)
    try:
        pending = await direct.list_jobs(status="PENDING")
        assert pending, "nothing was stored"
        due = set(await direct.due(100))
        assert {job.key for job in pending} <= due, "a stored job has no queue entry"
    finally:
        await direct.aclose()


async def test_lost_submit_reply_is_outcome_unknown_and_job_is_queued(
    redis_server: RedisServer,
) -> None:
    """A submit whose replies are lost (and its resend's) raises OutcomeUnknown (maybe
    applied, naming the key and `ai-lease status`); record and queue entry were written
    together."""
    redis_server.flushall()
    async with ChaosProxy("127.0.0.1", redis_server.port) as proxy:
        store = RedisStore.from_url(proxy.url_for(), op_timeout=OP_TIMEOUT)
        try:
            await store.get("warm-up")
            proxy.drop_reply_to(script_sha(lua.SUBMIT), times=2)  # the resend's reply, too
            with pytest.raises(OutcomeUnknown) as info:
                await store.submit("lost-submit", '{"key": "x"}', "fp")
            assert info.value.maybe_applied and "ai-lease status lost-submit" in str(info.value)
            assert proxy.dropped == 2
            job = await store.get("lost-submit")
            assert job is not None and job.status is Status.PENDING
            assert "lost-submit" in await store.due(10)
        finally:
            await store.aclose()


# -- a restart without persistence (issue 12 D) ------------------------------------------------


async def test_restart_without_data_is_noticed_and_reported() -> None:
    """Redis restarted empty: the worker's next due() notices the lost epoch marker and
    data_lost() says so; a process started afterwards reads the note the first one left."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, op_timeout=1.0)
        later: RedisStore | None = None
        try:
            await store.submit("before", "{}", "fp")
            await store.due(10)
            assert await store.data_lost() is None
            server.restart()
            await store.due(10)
            loss = await store.data_lost()
            assert isinstance(loss, StoreDataLost) and "appendonly yes" in str(loss)
            later = RedisStore.from_url(server.url, op_timeout=1.0)
            assert isinstance(await later.data_lost(), StoreDataLost)
        finally:
            await store.aclose()
            if later is not None:
                await later.aclose()


async def test_owner_re_creating_a_lost_record_writes_the_spec_back() -> None:
    """After a restart without data, the record an owner re-creates carries the job's spec
    again, so a worker can still run it."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, op_timeout=1.0)
        try:
            await store.submit("job", '{"key": "job"}', "fp")
            assert (await store.get("job")) is not None
            won = await store.acquire("job", "A", ttl=30, max_no_progress=5, fingerprint="fp")
            assert isinstance(won, Acquired)
            server.restart()
            renewal = await store.renew(
                won.fence, ttl=30, stage="s", progress_version=1, max_no_progress=5, grace=1
            )
            assert not renewal.ok and renewal.reason == "missing"
            again = await store.acquire("job", "A2", ttl=30, max_no_progress=5, fingerprint="fp")
            assert isinstance(again, Acquired)
            record = await store.get("job")
            assert record is not None and record.spec == '{"key": "job"}'
        finally:
            await store.aclose()


async def test_lapsed_lease_without_queue_entry_is_due(rstore: RedisStore) -> None:
    """A RUNNING record whose lease lapsed is found by due() even with no queue entry (the
    lease index the acquire and renew scripts keep)."""
    won = await rstore.acquire("orphan", "A", ttl=0.2, max_no_progress=5)
    assert isinstance(won, Acquired)
    assert "orphan" not in await rstore.due(10)
    await asyncio.sleep(0.3)
    assert (await rstore.due(10))[0] == "orphan"
    await rstore.reschedule("orphan", None)  # a worker gives it up: no longer due
    assert "orphan" not in await rstore.due(10)


def test_a_redis_url_database_must_be_a_number() -> None:
    """redis://host/abc is a configuration error, not silently database 0."""
    with pytest.raises(ConfigError, match="'abc' is not a number"):
        open_store("redis://127.0.0.1:6379/abc")
    with pytest.raises(ConfigError, match="Cluster has only database 0"):
        open_store("redis+cluster://127.0.0.1:7000/3")


def test_status_and_workers_print_the_data_loss(tmp_path: Path) -> None:
    """After a worker noticed Redis lost its data, `ai-lease status` (which now finds no
    job) and `ai-lease workers` say so on stderr, with the durable set-up to use."""
    from tests.test_cli_basics import run_cli

    async def notice(url: str, server: RedisServer) -> None:
        store = RedisStore.from_url(url, op_timeout=1.0)
        try:
            await store.submit("gone", "{}", "fp")
            await store.due(10)
            server.restart()
            await store.due(10)  # a worker's sweep
        finally:
            await store.aclose()

    with RedisServer() as server:
        asyncio.run(notice(server.url, server))
        status = run_cli("--store", server.url, "status", "gone", cwd=tmp_path)
        workers = run_cli("--store", server.url, "workers", cwd=tmp_path)
    assert status.returncode == 2 and "no job 'gone'" in status.stderr
    for out in (status, workers):
        assert "lost its data" in out.stderr and "appendonly yes" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


async def test_more_calls_at_once_than_a_pool_holds_all_answer(redis_server: RedisServer) -> None:
    """400 calls at once (redis-py 8's pool holds 100 by default and fails the 101st at
    once): every one answers; the extra ones wait their turn, not an error. (A generous
    op_timeout: a call's wait for its turn counts against it, and on a loaded machine 400
    calls take longer than the 0.5 s the other tests use; what is pinned here is no error.)"""
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=30.0)
    try:
        await store.submit("crowded", "{}", "fp")
        jobs = await asyncio.gather(*(store.get("crowded") for _ in range(400)))
    finally:
        await store.aclose()
    assert all(job is not None and job.key == "crowded" for job in jobs)
