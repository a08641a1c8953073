"""The lean adapter's HTTP paths on the wire: aiohttp and httpx against a loopback server.

What a kept HTTP library must do for a streamed chat call (and the hand-written reader it
replaced did not): refuse a response whose framing is ambiguous, reuse connections, decode
a compressed stream with its decoded size still bounded, and hold a bounded pool whose wait
is not counted as model latency.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import orjson
import pytest

from ai_lease.errors import ConfigError, PoolTimeout, ProviderError, StreamLimitExceeded
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts
from tests.harness.sse_server import Hang, Sleep, SSEServer, chat_chunks, raw, sse

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
RELAXED = StreamTimeouts(first_token=5.0, idle=5.0, total=10.0)
PATHS = ["aiohttp", "httpx"]


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


def wire(*chunks: dict[str, object]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


async def guarded(provider: OpenAICompatProvider, limits: StreamTimeouts = RELAXED) -> str:
    completion = await StreamGuard(limits, Progress()).call(provider, REQUEST)
    return completion.text


@pytest.mark.parametrize("http", PATHS)
async def test_conflicting_framing_is_refused(server: SSEServer, http: str) -> None:
    """``Transfer-Encoding: gzip, chunked`` beside a Content-Length is an error, not a body."""
    body = wire(*chat_chunks(["ok"]))
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    server.enqueue(
        raw(200, chunked, "text/event-stream", headers={"Transfer-Encoding": "gzip, chunked"})
    )
    provider = OpenAICompatProvider(base_url=server.base_url, model="m", http=http)  # type: ignore[arg-type]
    try:
        with pytest.raises(ProviderError):
            await guarded(provider)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
async def test_connections_are_reused(server: SSEServer, http: str) -> None:
    """Two streams one after the other travel on one kept-alive connection."""
    server.enqueue(sse(*chat_chunks(["a"])), sse(*chat_chunks(["b"])))
    provider = OpenAICompatProvider(base_url=server.base_url, model="m", http=http)  # type: ignore[arg-type]
    try:
        assert [await guarded(provider), await guarded(provider)] == ["a", "b"]
        assert server.connections_open == 1
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
async def test_a_compressed_stream_is_decoded(server: SSEServer, http: str) -> None:
    """A server that gzips the stream although identity was asked is decoded."""
    body = gzip.compress(wire(*chat_chunks(["Hel", "lo"])))
    server.enqueue(sse(body, done=False, headers={"Content-Encoding": "gzip"}))
    provider = OpenAICompatProvider(base_url=server.base_url, model="m", http=http)  # type: ignore[arg-type]
    try:
        assert await guarded(provider) == "Hello"
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
async def test_a_compressed_endless_event_is_bounded_after_decoding(
    server: SSEServer, http: str
) -> None:
    """64 MiB of one event compressed to ~64 KiB still stops at max_event_bytes, decoded."""
    body = gzip.compress(b"data: " + b"x" * (64 << 20))
    server.enqueue(sse(body, done=False, headers={"Content-Encoding": "gzip"}))
    provider = OpenAICompatProvider(
        base_url=server.base_url,
        model="m",
        http=http,  # type: ignore[arg-type]
        max_event_bytes=256 * 1024,
    )
    try:
        with pytest.raises(StreamLimitExceeded) as caught:
            await guarded(provider)
        assert caught.value.limit == "max_event_bytes"
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
async def test_pool_wait_is_not_model_latency(server: SSEServer, http: str) -> None:
    """With one connection, a second stream waits for the first; its first-token clock
    starts when it holds the connection, so the wait does not make it time out."""
    slow = sse(Sleep(0.6), *chat_chunks(["x"]))
    server.enqueue(slow, slow)
    provider = OpenAICompatProvider(
        base_url=server.base_url,
        model="m",
        http=http,  # type: ignore[arg-type]
        max_connections=1,
        pool_timeout=5.0,
    )
    limits = StreamTimeouts(first_token=1.0, idle=5.0, total=10.0)
    try:
        texts = await asyncio.gather(guarded(provider, limits), guarded(provider, limits))
        assert texts == ["x", "x"]
        assert server.connections_open <= 1
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
async def test_pool_wait_has_its_own_bound_and_error(server: SSEServer, http: str) -> None:
    """A stream that finds the only connection busy past pool_timeout is a PoolTimeout."""
    server.enqueue(sse(Sleep(1.0), *chat_chunks(["x"])))
    provider = OpenAICompatProvider(
        base_url=server.base_url,
        model="m",
        http=http,  # type: ignore[arg-type]
        max_connections=1,
        pool_timeout=0.2,
    )
    try:
        first, second = await asyncio.gather(
            guarded(provider), guarded(provider), return_exceptions=True
        )
        assert first == "x"
        assert isinstance(second, PoolTimeout) and second.retryable
        assert "max_connections" in str(second)
    finally:
        await provider.aclose()


@pytest.mark.parametrize(
    ("setting", "path", "own_client"),
    [
        ("auto", "aiohttp", False),
        ("aiohttp", "aiohttp", False),
        ("httpx", "httpx", False),
        ("auto", "httpx", True),  # a caller's own httpx client always means httpx
    ],
)
async def test_http_setting_picks_the_path(setting: str, path: str, own_client: bool) -> None:
    """``provider.http`` names the HTTP path."""
    import httpx

    client = httpx.AsyncClient() if own_client else None
    provider = OpenAICompatProvider(
        base_url="http://127.0.0.1:9/v1",
        http=setting,  # type: ignore[arg-type]
        client=client,
    )
    try:
        assert provider.http == path
    finally:
        await provider.aclose()
        if client is not None:
            await client.aclose()


def test_a_bad_http_setting_or_pool_size_is_a_config_error() -> None:
    """An unknown HTTP path or a pool of no connections is refused, naming the field."""
    with pytest.raises(ConfigError, match=r"provider\.http"):
        OpenAICompatProvider(base_url="http://127.0.0.1:9/v1", http="h2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"provider\.max_connections"):
        OpenAICompatProvider(base_url="http://127.0.0.1:9/v1", max_connections=0)


@pytest.mark.parametrize("http", PATHS)
async def test_a_proxy_from_the_environment_is_used(
    server: SSEServer, http: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY in the environment carries the stream (the loopback server is the proxy)."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server.enqueue(sse(*chat_chunks(["via proxy"])))
    provider = OpenAICompatProvider(base_url="http://llm.invalid/v1", model="m", http=http)  # type: ignore[arg-type]
    try:
        assert await guarded(provider) == "via proxy"
        assert server.requests[0].path == "http://llm.invalid/v1/chat/completions"
    finally:
        await provider.aclose()


@pytest.mark.parametrize("http", PATHS)
@pytest.mark.parametrize("where", ["body", "head"])
async def test_read_timeout_fails_a_silent_stream(server: SSEServer, http: str, where: str) -> None:
    """No byte for ``read_timeout``, before the head or mid-body: a retryable ProviderError
    (the read timeout, not the guard's idle timer, which is far away here), soon after."""
    if where == "body":
        server.enqueue(sse(*chat_chunks(["Hel"], finish_reason=None)[:2], Hang()))
    else:
        server.enqueue(sse(*chat_chunks(["x"]), delay=30.0))
    provider = OpenAICompatProvider(
        base_url=server.base_url,
        model="m",
        http=http,  # type: ignore[arg-type]
        read_timeout=0.4,
    )
    started = asyncio.get_running_loop().time()
    try:
        with pytest.raises(ProviderError) as caught:
            await guarded(provider, StreamTimeouts(first_token=20.0, idle=20.0, total=30.0))
    finally:
        await provider.aclose()
    took = asyncio.get_running_loop().time() - started
    assert caught.value.retryable and "timeout" in str(caught.value).lower(), caught.value
    # real: a socket to the loopback test server
    assert 0.35 < took < 3.0, f"took {took:.2f}s for a 0.4 s read timeout"


async def test_the_sdk_adapter_decodes_then_bounds_a_compressed_stream(server: SSEServer) -> None:
    """The SDK adapter's event watch reads the decoded body: a gzipped stream is text, and a
    compressed endless event stops at max_event_bytes, measured after decoding."""
    from ai_lease.providers.openai_sdk import OpenAISDKProvider

    server.enqueue(sse(gzip.compress(wire(*chat_chunks(["Hel", "lo"]))), done=False, headers=GZIP))
    server.enqueue(sse(gzip.compress(b"data: " + b"x" * (64 << 20)), done=False, headers=GZIP))
    provider = OpenAISDKProvider(base_url=server.base_url, model="m", max_event_bytes=256 * 1024)
    try:
        completion = await StreamGuard(RELAXED, Progress()).call(provider, REQUEST)
        assert completion.text == "Hello"
        with pytest.raises(StreamLimitExceeded) as caught:
            await StreamGuard(RELAXED, Progress()).call(provider, REQUEST)
        assert caught.value.limit == "max_event_bytes"
    finally:
        await provider.aclose()


GZIP = {"Content-Encoding": "gzip"}
