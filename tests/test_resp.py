"""The Redis store's multiplexed fast path (ai_lease/lease/resp.py): the reply parser fed
piece by piece, then the connection against real redis-server processes."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from typing import Any

import hiredis
import pytest
import redis
import redis.asyncio as aioredis
from redis.credentials import UsernamePasswordCredentialProvider
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ai_lease import CorruptRecord, StoreUnavailable
from ai_lease.lease.redis import RedisStore
from ai_lease.lease.resp import Multiplexed, RespParser, pack
from ai_lease.testing.contract import LeaseStoreContract
from tests.harness.redis_server import RedisServer
from tests.harness.tcp_proxy import FaultProxy

# -- the parser ------------------------------------------------------------------------------

WIRE = (
    b"+OK\r\n"
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
    b":-42\r\n"
    b"$6\r\nh\xc3\xa9llo\r\n"  # multi-byte UTF-8 across a piece boundary, somewhere
    b"$0\r\n\r\n"
    b"$-1\r\n"
    b"*-1\r\n"
    b"*0\r\n"
    b"*3\r\n$8\r\nacquired\r\n:1\r\n*2\r\n$1\r\na\r\n$0\r\n\r\n"
    b"$12\r\nline\r\nbreaks\r\n"
)


def replies(parser: Any, pieces: list[bytes]) -> list[Any]:
    out = []
    for piece in pieces:
        parser.feed(piece)
        while (reply := parser.gets()) is not False:
            out.append(str(reply) if isinstance(reply, ResponseError) else reply)
    return out


EXPECTED = [
    "OK",
    "NOSCRIPT No matching script. Please use EVAL.",
    -42,
    "héllo",
    "",
    None,
    None,
    [],
    ["acquired", 1, ["a", ""]],
    "line\r\nbreaks",
]


def test_parser_reads_every_reply_kind_however_the_bytes_are_split() -> None:
    assert replies(RespParser(), [WIRE]) == EXPECTED
    for cut in range(len(WIRE) + 1):
        assert replies(RespParser(), [WIRE[:cut], WIRE[cut:]]) == EXPECTED, cut
    rng = random.Random(3)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(WIRE)), 12))
        pieces = [WIRE[a:b] for a, b in zip([0, *cuts], [*cuts, len(WIRE)], strict=True)]
        assert replies(RespParser(), pieces) == EXPECTED


def test_parser_agrees_with_hiredis() -> None:
    """The fallback parser and hiredis (what the store uses when installed) read alike."""
    reader = hiredis.Reader(encoding="utf-8", replyError=ResponseError)
    assert replies(reader, [WIRE]) == replies(RespParser(), [WIRE])


@pytest.mark.parametrize("make", [RespParser, lambda: hiredis.Reader(encoding="utf-8")])
def test_a_reply_that_is_not_utf8_fails_alone_and_the_next_is_read(make: Any) -> None:
    parser = make()
    parser.feed(b"*2\r\n$2\r\n\xff\xfe\r\n$2\r\nok\r\n+NEXT\r\n")
    with pytest.raises(UnicodeDecodeError):
        parser.gets()
    assert parser.gets() == "NEXT"
    assert parser.gets() is False


def test_pack_is_a_resp_array_of_bulk_strings() -> None:
    assert pack("EVALSHA", "ab", 1, b"k") == (
        b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$1\r\nk\r\n"
    )
    assert pack("SET", "k", "é") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\xc3\xa9\r\n"


# -- the connection, against redis-server ----------------------------------------------------

ECHO = "return {KEYS[1], ARGV[1], redis.call('INCR', KEYS[1])}"
SHA = hashlib.sha1(ECHO.encode()).hexdigest()


@pytest.fixture(params=["hiredis", "python"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with hiredis and with the fallback parser."""
    if request.param == "python":
        monkeypatch.setattr("ai_lease.lease.resp._HIREDIS", False)
    return str(request.param)


@pytest.fixture
async def mux(redis_server: RedisServer, parser: str) -> AsyncIterator[Multiplexed]:
    redis_server.flushall()
    made = Multiplexed(host="127.0.0.1", port=redis_server.port, scripts={SHA: ECHO})
    yield made
    await made.aclose()


async def test_concurrent_callers_each_get_their_own_reply(mux: Multiplexed) -> None:
    async def one(i: int) -> list[Any]:
        reply: list[Any] = await mux.evalsha(SHA, [f"k{i % 7}"], [f"v{i}"])
        return reply

    results = await asyncio.gather(*(one(i) for i in range(500)))
    assert [r[:2] for r in results] == [[f"k{i % 7}", f"v{i}"] for i in range(500)]
    counts = sorted(r[2] for r in results if r[0] == "k0")
    assert counts == list(range(1, len(counts) + 1))  # each INCR ran exactly once


async def test_a_flushed_script_cache_is_refilled_by_eval(
    mux: Multiplexed, redis_server: RedisServer
) -> None:
    assert (await mux.evalsha(SHA, ["k"], ["a"]))[2] == 1
    redis.Redis(port=redis_server.port).script_flush()
    assert (await mux.evalsha(SHA, ["k"], ["b"]))[2] == 2
    assert (await mux.evalsha(SHA, ["k"], ["c"]))[2] == 3


async def test_script_errors_are_raised_and_the_connection_goes_on(mux: Multiplexed) -> None:
    redis.Redis(port=mux._port).set("text", "not a number")
    with pytest.raises(ResponseError, match="not an integer"):
        await mux.evalsha(SHA, ["text"], ["x"])
    assert (await mux.evalsha(SHA, ["n"], ["y"]))[2] == 1


async def test_a_lost_connection_fails_what_is_in_flight_then_reconnects(parser: str) -> None:
    with RedisServer() as server:
        mux = Multiplexed(host="127.0.0.1", port=server.port, scripts={SHA: ECHO})
        try:
            await mux.evalsha(SHA, ["k"], ["a"])
            server.restart()  # no persistence: the data and the script cache are gone
            with pytest.raises(RedisConnectionError):
                await mux.evalsha(SHA, ["k"], ["b"])
            assert (await mux.evalsha(SHA, ["k"], ["c"]))[2] == 1
        finally:
            await mux.aclose()


@pytest.fixture
async def proxied(
    redis_server: RedisServer, parser: str
) -> AsyncIterator[tuple[FaultProxy, Multiplexed]]:
    """A connection to redis-server through a fault proxy."""
    redis_server.flushall()
    async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
        made = Multiplexed(host="127.0.0.1", port=proxy.port, scripts={SHA: ECHO})
        yield proxy, made
        await made.aclose()


async def test_a_reply_whose_caller_gave_up_is_not_handed_to_the_next_caller(
    proxied: tuple[FaultProxy, Multiplexed],
) -> None:
    proxy, mux = proxied
    await mux.connect()
    proxy.delay(0.3)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await mux.evalsha(SHA, ["late"], ["first"])
    proxy.heal()
    assert (await mux.evalsha(SHA, ["next"], ["second"]))[:2] == ["next", "second"]


async def test_a_deadline_ends_the_wait_and_the_late_reply_is_dropped(
    proxied: tuple[FaultProxy, Multiplexed],
) -> None:
    """``deadline`` (what the store passes) ends the wait with TimeoutError on time; the
    late reply is read and dropped in turn, not handed to the next caller."""
    proxy, mux = proxied
    await mux.connect()
    proxy.delay(0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await mux.evalsha(SHA, ["late"], ["first"], deadline=started + 0.1)
    assert 0.09 <= loop.time() - started < 0.25
    proxy.heal()
    reply = await mux.evalsha(SHA, ["next"], ["second"], deadline=loop.time() + 2)
    assert reply[:2] == ["next", "second"]


async def test_reset_abandons_a_connection_stuck_in_set_up(
    proxied: tuple[FaultProxy, Multiplexed],
) -> None:
    proxy, mux = proxied
    proxy.black_hole()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await mux.evalsha(SHA, ["k"], ["a"])
    mux.reset()
    proxy.heal()
    async with asyncio.timeout(2):
        assert (await mux.evalsha(SHA, ["k"], ["b"]))[:2] == ["k", "b"]


async def test_password_and_database_are_set_up_on_connect(parser: str) -> None:
    with RedisServer(password="s3cret") as server:
        good = Multiplexed(
            host="127.0.0.1", port=server.port, password="s3cret", db=3, scripts={SHA: ECHO}
        )
        bad = Multiplexed(host="127.0.0.1", port=server.port, password="wrong", scripts={})
        try:
            await good.evalsha(SHA, ["in-db-3"], ["x"])
            check = redis.Redis(port=server.port, password="s3cret", db=3)
            assert check.get("in-db-3") == b"1"
            with pytest.raises(AuthenticationError):
                await bad.connect()
        finally:
            await good.aclose()
            await bad.aclose()


async def test_connection_refused_names_the_address() -> None:
    mux = Multiplexed(host="127.0.0.1", port=1, scripts={})
    with pytest.raises(RedisConnectionError, match=r"Error connecting to 127\.0\.0\.1:1"):
        await mux.connect()


async def test_a_timeout_fails_other_waiters_with_a_connection_error_not_a_cancellation() -> None:
    """A paused server: the first operation times out and drops the connection; operations
    waiting on the reconnection get StoreUnavailable, never a CancelledError nobody asked
    for (which would silently end a lease keeper)."""
    with RedisServer() as server:
        store = RedisStore.from_url(server.url, op_timeout=0.5)
        await store.get("warm")

        async def op(name: str, delay: float) -> str:
            await asyncio.sleep(delay)
            try:
                await store.get(name)
                return "ok"
            except StoreUnavailable as exc:
                return "unavailable" + (" (never sent)" if not exc.maybe_applied else "")

        server.pause()
        try:
            results = await asyncio.gather(op("A", 0.0), op("B", 0.1), op("C", 0.2))
        finally:
            server.resume()
        assert results[:2] == ["unavailable", "unavailable"]
        assert results[2].startswith("unavailable")
        assert await store.get("after") is None  # and then it works again
        await store.aclose()


async def test_a_record_that_is_not_utf8_is_corrupt_alone(
    redis_server: RedisServer, parser: str
) -> None:
    """Bytes that are not UTF-8 in one job's hash make that record corrupt; the connection
    every job shares goes on serving the others."""
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
    finally:
        await store.aclose()
        raw.close()


def test_only_plain_tcp_and_unix_sockets_take_the_fast_path() -> None:
    assert RedisStore.from_url("redis://127.0.0.1:6379/0")._fast is not None
    assert RedisStore.from_url("unix:///tmp/redis.sock?db=2")._fast is not None
    assert RedisStore.from_url("rediss://127.0.0.1:6380/0")._fast is None
    assert RedisStore.from_url("redis://127.0.0.1:6379/0", multiplex=False)._fast is None
    provided = aioredis.Redis(credential_provider=UsernamePasswordCredentialProvider(None, "pw"))
    assert RedisStore(provided)._fast is None  # credentials that may change: redis-py's job


# -- the contract once more, over redis-py's pooled connections --------------------------------


class TestPooledPathContract(LeaseStoreContract):
    """The same lease contract through redis-py's own client (what rediss:// uses)."""

    @pytest.fixture
    async def store(self, redis_server: RedisServer) -> AsyncIterator[RedisStore]:
        redis_server.flushall()
        made = RedisStore.from_url(redis_server.url, op_timeout=2.0, multiplex=False)
        yield made
        await made.aclose()

    @pytest.fixture
    def store_url(self, redis_server: RedisServer) -> str:
        return redis_server.url  # the multi-process race (its processes use the default path)
