"""Redis-specific behaviour: restarts without persistence, corrupt keys, unreachable and
black-holed servers, lost replies, one round trip per operation, one hash slot per job."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis
from redis.crc import key_slot

from ai_lease import CorruptRecord, Fence, FencingRejected, Following, StoreUnavailable
from ai_lease.lease import Acquired
from ai_lease.lease.redis import RedisStore
from tests.harness.redis_server import RedisServer, free_port
from tests.harness.tcp_proxy import FaultProxy


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
    for key in ("plain", "with}brace", "{tagged}", "ünïcode key"):
        slots = {key_slot(k.encode()) for k in store.keys(key)}
        assert len(slots) == 1, key


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
