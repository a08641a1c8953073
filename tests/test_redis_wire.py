"""How the Redis store talks to Redis (ai_lease/stores/redis/wire.py): redis-py for every URL,
retries off, a timeout that keeps its connection, the script cache refilled, set-up on connect.
(These replace the tests of the own connection, lease/resp.py, now deleted.)"""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from ai_lease import CorruptRecord, StoreUnavailable
from ai_lease.lease import Acquired
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.redis.wire import WARM_CONNECTIONS, WarmPool
from tests.harness.redis_server import RedisServer
from tests.harness.tcp_proxy import FaultProxy

REAL_TIME = "a socket to a real redis-server"


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "unix:///tmp/redis.sock?db=2", "rediss://127.0.0.1:6380/0"]
)
def test_every_url_goes_through_redis_py_with_retries_off(url: str) -> None:
    """redis://, unix:// and rediss:// all get redis-py's client (one code path), its
    retries off, no retry on timeout, no health-check PINGs."""
    store = RedisStore.from_url(url, op_timeout=0.5)
    assert isinstance(store._client, aioredis.Redis)
    pool = store._client.connection_pool
    assert isinstance(pool, WarmPool)
    kw = pool.connection_kwargs
    assert kw["retry"]._retries == 0 and not kw.get("retry_on_timeout")  # no public getter in 5.0
    assert kw["health_check_interval"] == 0 and kw["socket_connect_timeout"] == 0.5


async def test_a_timeout_fails_other_waiters_with_a_connection_error_not_a_cancellation() -> None:
    """A paused server: operations time out as StoreUnavailable, never a CancelledError
    nobody asked for (which would silently end a lease keeper); then it works again."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, op_timeout=0.5)
        await store.get("warm")

        async def op(name: str, delay: float) -> str:
            await asyncio.sleep(delay)
            try:
                await store.get(name)
                return "ok"
            except StoreUnavailable:
                return "unavailable"

        server.pause()
        try:
            results = await asyncio.gather(op("A", 0.0), op("B", 0.1), op("C", 0.2))
        finally:
            server.resume()
        assert results == ["unavailable"] * 3
        assert await store.get("after") is None  # and then it works again
        await store.aclose()


async def test_a_record_that_is_not_utf8_is_corrupt_alone(redis_server: RedisServer) -> None:
    """Bytes that are not UTF-8 in one job's hash make that record corrupt; the others are
    served as before."""
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=1.0)
    raw = redis.Redis(port=redis_server.port)
    try:
        await store.get("warm")
        raw.hset(
            store.keys("bad")[0],
            mapping={"schema": "1", "status": "RUNNING", "result": b"\xff\xfe"},
        )
        bad, good = await asyncio.gather(
            store.get("bad"), store.get("good"), return_exceptions=True
        )
        assert isinstance(bad, CorruptRecord) and "not valid UTF-8" in str(bad)
        assert good is None
        assert await store.get("good") is None
    finally:
        await store.aclose()
        raw.close()


async def test_a_flushed_script_cache_is_refilled_by_eval(redis_server: RedisServer) -> None:
    """SCRIPT FLUSH (what a restart does to the cache): the next operation still works."""
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=1.0)
    try:
        won = await store.acquire("k", "A", ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        redis.Redis(port=redis_server.port).script_flush()
        assert (await store.commit(won.fence, "r")).result == "r"
    finally:
        await store.aclose()


async def test_password_and_database_are_set_up_on_connect() -> None:
    """A password and a database number in the URL are used; a wrong password is
    StoreUnavailable that says it was never applied."""
    with RedisServer(password="s3cret") as server:
        good = RedisStore.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3", op_timeout=1.0)
        bad = RedisStore.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0", op_timeout=1.0)
        try:
            await good.submit("in-db-3", "{}", "fp")
            check = redis.Redis(port=server.port, password="s3cret", db=3)
            assert check.exists(good.keys("in-db-3")[0]) == 1
            check.close()
            with pytest.raises(StoreUnavailable) as info:
                await bad.get("x")
            assert not info.value.maybe_applied
        finally:
            await good.aclose()
            await bad.aclose()


async def test_a_dropped_connection_is_opened_again_in_the_background(
    redis_server: RedisServer,
) -> None:
    """Every connection reset: the next call succeeds (one resend), and the pool is warm
    again soon after, so later calls do not connect inside their own deadlines."""
    async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        store = RedisStore.from_url(proxy.url_for(), op_timeout=1.0)
        try:
            await store.due(1)
            pool = store._pool
            assert pool is not None and pool.idle_connected() == WARM_CONNECTIONS
            proxy.reset_all()
            await asyncio.sleep(0.05)
            await store.due(1)
            for _ in range(100):
                if pool.idle_connected() >= WARM_CONNECTIONS:
                    break
                await asyncio.sleep(0.02)
            assert pool.idle_connected() >= WARM_CONNECTIONS
        finally:
            await store.aclose()
