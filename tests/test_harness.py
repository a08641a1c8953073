"""Tests of the test harness itself: the redis-server process and the fault proxy."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.backoff
import redis.retry

from tests.harness import redis_server
from tests.harness.redis_server import RedisServer, free_port
from tests.harness.tcp_proxy import FaultProxy

REAL_TIME = "it tests the redis-server process and the fault proxy on real sockets"


pytestmark = pytest.mark.redis

SHORT_TIMEOUT_S = 0.3


@pytest.fixture
def occupied_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


@pytest.fixture
async def proxy(server: RedisServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", server.port) as running:
        yield running


def sync_client(url: str, socket_timeout: float = 5.0) -> redis.Redis:
    """A client that fails on the first error instead of retrying it away."""
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    )


def async_client(url: str, socket_timeout: float = 5.0) -> redis.asyncio.Redis:
    """An asyncio client that fails on the first error instead of retrying it away."""
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=socket_timeout,
        retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0),
    )


async def get(client: redis.asyncio.Redis, key: str) -> bytes | str | None:
    """GET as a plain coroutine, so it can become a task."""
    value: bytes | str | None = await client.get(key)
    return value


async def wait_for_bytes_up(proxy: FaultProxy, more_than: int) -> None:
    """Wait until the proxy has read more than ``more_than`` bytes from clients."""
    async with asyncio.timeout(5):
        # The counter is a plain int with no event behind it, so poll it briefly.
        while proxy.bytes_up <= more_than:  # noqa: ASYNC110
            await asyncio.sleep(0.005)


# -- RedisServer ---------------------------------------------------------------


def test_free_port_can_be_bound() -> None:
    """free_port() returns a loopback port that is actually free."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_server_answers_ping(server: RedisServer) -> None:
    """A started server answers PING at its url, on its port, as its own pid."""
    client = sync_client(server.url)
    try:
        assert client.ping() is True
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.pid > 0 and server.running
    finally:
        client.close()


def test_password_is_required_and_in_url() -> None:
    """With a password the url carries it and unauthenticated clients are refused."""
    with RedisServer(password="s3cret") as server:
        assert server.url == f"redis://:s3cret@127.0.0.1:{server.port}/0"
        good = sync_client(server.url)
        bad = sync_client(f"redis://127.0.0.1:{server.port}/0")
        try:
            assert good.ping() is True
            with pytest.raises(redis.exceptions.AuthenticationError):
                bad.ping()
        finally:
            good.close()
            bad.close()


def test_restart_keeps_port_and_loses_data(server: RedisServer) -> None:
    """restart() comes back on the same port with an empty dataset."""
    port, pid = server.port, server.pid
    client = sync_client(server.url)
    try:
        client.set("k", "v")
        server.restart()
        assert (server.port, server.pid != pid) == (port, True)
        assert client.get("k") is None
    finally:
        client.close()


def test_flushall_deletes_keys(server: RedisServer) -> None:
    """flushall() empties the server without restarting it."""
    client = sync_client(server.url)
    try:
        client.set("k", "v")
        server.flushall()
        assert client.get("k") is None
    finally:
        client.close()


def test_pause_times_out_and_resume_recovers(server: RedisServer) -> None:
    """A paused server makes commands hit the socket timeout; resume serves again."""
    client = sync_client(server.url, socket_timeout=SHORT_TIMEOUT_S)
    try:
        client.set("k", "v")
        server.pause()
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.get("k")
        assert time.monotonic() - started >= SHORT_TIMEOUT_S * 0.9
        server.resume()
        assert client.get("k") == b"v"
    finally:
        client.close()


def test_stop_and_kill_reap_the_process(server: RedisServer) -> None:
    """stop() and kill() leave no running process and can be followed by start()."""
    server.stop()
    assert not server.running
    server.start()
    server.pause()
    server.kill()
    assert not server.running


def test_context_exit_cleans_up_a_paused_server() -> None:
    """Leaving the with-block kills a paused server and removes its directory."""
    with RedisServer() as server:
        server.pause()
        log_path = server.log_path
        assert log_path is not None and log_path.exists()
    assert not server.running
    assert not log_path.parent.exists()


def test_start_failure_reports_the_log() -> None:
    """A server that cannot start raises RuntimeError quoting its own complaint."""
    with pytest.raises(RuntimeError, match="no-such-option"):
        with RedisServer(extra_args=["--no-such-option", "x"]):
            pass  # pragma: no cover


def test_missing_binary_fails_loudly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without redis-server on PATH start() raises instead of letting tests skip."""
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="redis-server is not on PATH"):
        with RedisServer():
            pass  # pragma: no cover


def test_explicit_port_in_use_fails(occupied_port: int) -> None:
    """An explicitly requested port that is taken is an error, not a silent move."""
    with pytest.raises(RuntimeError, match="Address already in use"):
        with RedisServer(port=occupied_port):
            pass  # pragma: no cover


def test_picked_port_taken_meanwhile_is_repicked(
    monkeypatch: pytest.MonkeyPatch, occupied_port: int
) -> None:
    """If the port free_port() picked is grabbed before redis binds it, start() picks another."""
    picks = iter([occupied_port])
    real_free_port = redis_server.free_port
    monkeypatch.setattr(redis_server, "free_port", lambda: next(picks, None) or real_free_port())
    with RedisServer() as server:
        assert server.port != occupied_port
        client = sync_client(server.url)
        try:
            assert client.ping() is True
        finally:
            client.close()


# -- FaultProxy ----------------------------------------------------------------


async def test_proxy_forwards(proxy: FaultProxy) -> None:
    """Through a healthy proxy SET/GET work and the counters move."""
    client = async_client(proxy.url_for())
    try:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
    finally:
        await client.aclose()
    assert proxy.connections_total == 1
    assert proxy.bytes_up > 0 and proxy.bytes_down > 0


async def test_delay_adds_latency(proxy: FaultProxy) -> None:
    """With delay(mean, jitter) a round trip takes at least mean - jitter."""
    client = async_client(proxy.url_for())
    try:
        await client.ping()  # connect before measuring
        proxy.delay(0.2, 0.05)
        started = time.monotonic()
        assert await client.ping() is True
        # Both directions are delayed, so even one leg exceeds mean - jitter.
        assert time.monotonic() - started >= 0.15
        proxy.heal()
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_delay_preserves_order(proxy: FaultProxy) -> None:
    """Pipelined commands under jittery delay still get their own replies in order."""
    client = async_client(proxy.url_for())
    try:
        proxy.delay(0.01, 0.01)
        replies = await asyncio.gather(*(client.echo(str(i)) for i in range(20)))
        assert replies == [str(i).encode() for i in range(20)]
    finally:
        await client.aclose()


async def test_black_hole_times_out_and_heal_restores(proxy: FaultProxy) -> None:
    """black_hole() makes a command hit its socket timeout; after heal() a new connection works."""
    client = async_client(proxy.url_for(), socket_timeout=SHORT_TIMEOUT_S)
    try:
        await client.set("k", "v")
        proxy.black_hole()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.get("k")
        proxy.heal()
        # redis-py drops a timed-out connection, so this GET dials a fresh one.
        assert await client.get("k") == b"v"
        assert proxy.connections_total == 2
    finally:
        await client.aclose()


async def test_drop_replies_then_close(server: RedisServer, proxy: FaultProxy) -> None:
    """The command runs on the server but the client only sees its connection close."""
    client = async_client(proxy.url_for())
    direct = sync_client(server.url)
    try:
        await client.ping()
        proxy.drop_replies_then_close()
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.set("k", "v")
        assert direct.get("k") == b"v"
    finally:
        await client.aclose()
        direct.close()


async def test_reset_all_fails_an_in_flight_command(proxy: FaultProxy) -> None:
    """reset_all() turns a command waiting on an open connection into a connection error."""
    client = async_client(proxy.url_for())
    try:
        await client.ping()
        proxy.black_hole()
        sent = proxy.bytes_up
        pending = asyncio.create_task(get(client, "k"))
        try:
            await wait_for_bytes_up(proxy, sent)  # the GET is on the wire, unanswered
            proxy.reset_all()
            with pytest.raises(redis.exceptions.ConnectionError):
                await pending
        finally:
            pending.cancel()
        proxy.heal()
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_reset_all_sends_rst(proxy: FaultProxy) -> None:
    """reset_all() aborts with RST, so the peer sees ECONNRESET rather than EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(b"PING\r\n")
        assert await reader.readline() == b"+PONG\r\n"
        proxy.reset_all()
        with pytest.raises(ConnectionResetError):
            await reader.read(1)
    finally:
        writer.close()
        with pytest.raises(ConnectionResetError):
            await writer.wait_closed()


async def test_target_down_closes_client(server: RedisServer, proxy: FaultProxy) -> None:
    """With the target dead, a client connecting through the proxy is closed at once."""
    server.kill()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        assert await reader.read(1) == b""
    finally:
        writer.close()
        await writer.wait_closed()


async def test_aclose_closes_open_connections(server: RedisServer) -> None:
    """aclose() ends every proxied connection and leaves no task behind."""
    proxy = await FaultProxy("127.0.0.1", server.port).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(b"PING\r\n")
        assert await reader.readline() == b"+PONG\r\n"
        proxy.black_hole()
        await proxy.aclose()
        assert await reader.read(1) == b""
        assert proxy._pipes == {}
    finally:
        writer.close()
        await writer.wait_closed()
