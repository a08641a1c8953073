"""Both OpenAI adapters against real HTTP on loopback (the scripted SSE server), and the
lean adapter's HTTP exchange under respx: stalls, drips, pings, cuts, resets, status codes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
import respx

from ai_lease.errors import (
    FirstTokenTimeout,
    ProviderError,
    StreamIdleTimeout,
    StreamTotalTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Completion, Provider, Usage
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.retry import call_with_retries
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import RetryPolicy, StreamTimeouts
from tests.harness.sse_server import (
    Cut,
    Event,
    Hang,
    Reset,
    Response,
    Sleep,
    SSEServer,
    chat_chunks,
    completion_json,
    drip,
    json_response,
    raw,
    sse,
)

CANARY = "sk-CANARY-test"
REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
FAST_RETRY = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.05)
RELAXED = StreamTimeouts(first_token=5.0, idle=5.0, total=10.0)
ADAPTERS: dict[str, Callable[..., Provider]] = {
    "compat": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "compat-httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}


# -- fixtures and helpers --------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


def make_provider(kind: str, server: SSEServer) -> Provider:
    return ADAPTERS[kind](base_url=server.base_url, api_key=CANARY, model="m")


@pytest.fixture(params=sorted(ADAPTERS))
async def provider(request: pytest.FixtureRequest, server: SSEServer) -> AsyncIterator[Provider]:
    """Each adapter, pointed at the loopback server with the canary key."""
    made = make_provider(request.param, server)
    yield made
    await made.aclose()


def timeouts(first_token: float = 5.0, idle: float = 5.0, total: float = 10.0) -> StreamTimeouts:
    return StreamTimeouts(first_token=first_token, idle=idle, total=total)


async def collect(
    provider: Provider, limits: StreamTimeouts = RELAXED, progress: Progress | None = None
) -> Completion:
    """One guarded streamed call, as the call_ai stage makes it."""
    return await StreamGuard(limits, progress or Progress()).call(provider, REQUEST)


async def timed(call: Awaitable[Any]) -> tuple[float, BaseException | None]:
    """Seconds ``call`` took and the exception it raised (None if it returned)."""
    started = time.monotonic()
    try:
        await call
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


async def timed_guard(
    provider: Provider, limits: StreamTimeouts, progress: Progress | None = None
) -> tuple[float, BaseException | None]:
    """A guarded call expected to time out: seconds from what the fired budget counts from
    (the call's start; the last content delta for idle) to the error, and the error.

    A cold client's set-up before its first content (the SDK's lazy imports on a loaded
    machine) is part of the elapsed time, not of the idle timer's error."""
    guard = StreamGuard(limits, progress or Progress())
    _, error = await timed(guard.call(provider, REQUEST))
    fired_at = time.monotonic()
    if isinstance(error, StreamIdleTimeout):
        assert guard.last_content_at is not None
        return fired_at - guard.last_content_at, error
    return fired_at - guard.started_at, error


def assert_fired_near(elapsed: float, budget: float) -> None:
    slack = max(0.1, budget * 0.1)
    # real: a socket to the loopback test server
    assert budget - 0.02 <= elapsed <= budget + slack, f"fired at {elapsed:.3f}s, budget {budget}s"


def content_chunks(*texts: str) -> list[dict[str, Any]]:
    """The role chunk and one content chunk per text: no finish reason, no usage."""
    return chat_chunks(list(texts), finish_reason=None)


def byte_by_byte(chunk: dict[str, Any], every: float) -> list[Event]:
    """One SSE event's bytes sent one at a time, ``every`` seconds apart."""
    wire = b"data: " + orjson.dumps(chunk) + b"\n\n"
    events: list[Event] = []
    for byte in wire:
        events += [Sleep(every), bytes([byte])]
    return events


def retrying(
    provider: Provider, errors: list[BaseException], limits: StreamTimeouts = RELAXED
) -> Awaitable[Completion]:
    """A guarded streamed call under call-level retries, recording each retried error."""
    return call_with_retries(
        lambda: collect(provider, limits),
        FAST_RETRY,
        on_retry=lambda exc, _wait: errors.append(exc),
    )


# -- the happy path --------------------------------------------------------------------------


async def test_stream_reassembles_text_finish_and_usage(
    provider: Provider, server: SSEServer
) -> None:
    """Content is joined in order, finish reason and usage arrive; progress is marked once
    per network read that brought content (at most once per chunk, at least once)."""
    server.enqueue(sse(*chat_chunks(["Hel", "lo", " world"], usage=(3, 3))))
    progress = Progress()
    before = progress.version
    completion = await collect(provider, RELAXED, progress)
    assert completion.text == "Hello world"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(3, 3)
    assert completion.chunks == 3
    assert 1 <= progress.version - before <= 3


async def test_stream_request_asks_for_usage_with_the_bearer_key(
    provider: Provider, server: SSEServer
) -> None:
    """The streamed request is POST /v1/chat/completions with stream + include_usage + bearer."""
    server.enqueue(sse(*chat_chunks(["ok"], usage=(1, 1))))
    await collect(provider)
    [request] = server.requests
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["authorization"] == f"Bearer {CANARY}"
    assert request.json["model"] == "m"
    assert request.json["messages"] == [{"role": "user", "content": "hi"}]
    assert request.json["stream"] is True
    assert request.json["stream_options"] == {"include_usage": True}


# -- stream timeouts over real sockets -------------------------------------------------------


@pytest.mark.parametrize(
    "response",
    [sse(Hang()), sse(*chat_chunks(["late"]), delay=30.0)],
    ids=["headers-then-hang", "no-headers"],
)
async def test_stall_before_first_token(
    provider: Provider, server: SSEServer, response: Response
) -> None:
    """No content within first_token: FirstTokenTimeout on time, upstream connection closed."""
    server.enqueue(response)
    elapsed, error = await timed(collect(provider, timeouts(first_token=0.3)))
    assert isinstance(error, FirstTokenTimeout), repr(error)
    assert (error.budget_s, error.chunks, error.text) == (0.3, 0, "")
    assert_fired_near(elapsed, 0.3)
    await server.wait_connections_open(0)


async def test_stall_mid_stream(provider: Provider, server: SSEServer) -> None:
    """Content, then silence: StreamIdleTimeout keeps what arrived; upstream connection closed."""
    server.enqueue(sse(*content_chunks("Hel", "lo"), Hang()))
    elapsed, error = await timed_guard(provider, timeouts(idle=0.3))
    assert isinstance(error, StreamIdleTimeout), repr(error)
    assert (error.budget_s, error.chunks, error.text) == (0.3, 2, "Hello")
    assert_fired_near(elapsed, 0.3)
    await server.wait_connections_open(0)


PINGS: list[Event] = [b": ping\n\n", Sleep(0.05)] * 40


@pytest.mark.parametrize(
    ("events", "expected", "version"),
    [
        ([*content_chunks(), *PINGS, Hang()], FirstTokenTimeout, 0),
        ([*content_chunks("Hel"), *PINGS, Hang()], StreamIdleTimeout, 1),
    ],
    ids=["before-first-token", "mid-stream"],
)
async def test_keep_alive_pings_are_not_progress(
    provider: Provider,
    server: SSEServer,
    events: list[Event],
    expected: type[FirstTokenTimeout | StreamIdleTimeout],
    version: int,
) -> None:
    """`: ping` every 50 ms neither holds the timers off nor moves the progress version."""
    server.enqueue(sse(*events))
    progress = Progress()
    elapsed, error = await timed_guard(provider, timeouts(first_token=0.3, idle=0.3), progress)
    assert isinstance(error, expected), repr(error)
    assert_fired_near(elapsed, 0.3)
    assert progress.version == version
    assert progress.idle() >= 0.3 - 0.02  # nothing counted during the pings
    await server.wait_connections_open(0)


async def test_slow_drip_within_idle_hits_the_total(provider: Provider, server: SSEServer) -> None:
    """Content every 0.15 s never trips idle 0.3 s, but the total 1.0 s still fires."""
    server.enqueue(sse(*drip("x" * 40, every=0.15)))
    progress = Progress()
    limits = timeouts(first_token=0.5, idle=0.3, total=1.0)
    elapsed, error = await timed(collect(provider, limits, progress))
    assert isinstance(error, StreamTotalTimeout), repr(error)
    assert_fired_near(elapsed, 1.0)
    assert 4 <= error.chunks <= 8
    assert error.text == "x" * error.chunks
    assert progress.version == error.chunks
    await server.wait_connections_open(0)


@pytest.mark.parametrize(
    ("before", "expected", "text"),
    [
        (content_chunks(), FirstTokenTimeout, ""),
        (content_chunks("Hel"), StreamIdleTimeout, "Hel"),
    ],
    ids=["first-token", "idle"],
)
async def test_bytes_flowing_without_a_whole_delta_still_time_out(
    provider: Provider,
    server: SSEServer,
    before: list[dict[str, Any]],
    expected: type[FirstTokenTimeout | StreamIdleTimeout],
    text: str,
) -> None:
    """One byte of a chunk every 0.15 s keeps the socket busy, yet the 0.4 s token timer fires.

    The idle case gives its first-token timer, which it does not test, 5 s: at 0.4 s it raced
    the first chunk on a loaded machine and fired first."""
    dripped = byte_by_byte(content_chunks("lo")[1], every=0.15)
    server.enqueue(sse(*before, *dripped))
    first_token = 0.4 if expected is FirstTokenTimeout else 5.0
    elapsed, error = await timed_guard(provider, timeouts(first_token=first_token, idle=0.4))
    assert isinstance(error, expected), repr(error)
    assert (error.budget_s, error.text) == (0.4, text)
    assert_fired_near(elapsed, 0.4)
    await server.wait_connections_open(0)


# -- broken streams --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("texts", "partial"), [((), False), (("Hel",), True)], ids=["first", "after-content"]
)
async def test_malformed_json_chunk_is_a_retryable_provider_error(
    provider: Provider, server: SSEServer, texts: tuple[str, ...], partial: bool
) -> None:
    """A chunk that is not JSON is a retryable ProviderError, `partial` if content came first."""
    server.enqueue(sse(*content_chunks(*texts), b"data: {not json\n\n", *chat_chunks(["lo"])))
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert caught.value.retryable is True
    assert caught.value.partial is partial


@pytest.mark.parametrize(
    "chunk",
    [
        b"[]",
        b"null",
        b'{"choices": [5]}',
        b'{"choices": [{"index": 0, "delta": {"content": 5}}]}',
        b'{"choices": [], "usage": {"prompt_tokens": "many", "completion_tokens": 1}}',
    ],
    ids=["list", "null", "choice-not-object", "content-not-text", "usage-not-numbers"],
)
async def test_json_that_is_not_a_chunk_is_a_provider_error(
    provider: Provider, server: SSEServer, chunk: bytes
) -> None:
    """Valid JSON of the wrong shape is garbage too: a retryable ProviderError, no raw crash."""
    server.enqueue(sse(*content_chunks("Hel"), b"data: " + chunk + b"\n\n", *chat_chunks(["lo"])))
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert (caught.value.retryable, caught.value.partial) == (True, True)


async def test_error_object_mid_stream_carries_its_message(
    provider: Provider, server: SSEServer
) -> None:
    """An `{"error": ...}` event after content is a retryable ProviderError with its message."""
    error = {"error": {"message": "the model is overloaded", "type": "server_error"}}
    server.enqueue(sse(*content_chunks("Hel"), error, *chat_chunks(["lo"])))
    with pytest.raises(ProviderError, match="the model is overloaded") as caught:
        await collect(provider)
    assert (caught.value.retryable, caught.value.partial) == (True, True)


CUT_SHORT = content_chunks("Hel", "lo")


@pytest.mark.parametrize(
    "response",
    [
        sse(*CUT_SHORT, Cut()),
        sse(*CUT_SHORT, Cut(), chunked=False),
        sse(*CUT_SHORT, done=False),
        sse(*CUT_SHORT, done=False, chunked=False),
    ],
    ids=["chunked-cut", "close-delimited-cut", "chunked-no-done", "close-delimited-no-done"],
)
async def test_stream_cut_before_done_is_never_a_short_answer(
    provider: Provider, server: SSEServer, response: Response
) -> None:
    """A stream ending with no finish reason and no [DONE] is a ProviderError marked partial."""
    server.enqueue(response)
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert caught.value.retryable is True
    assert caught.value.partial is True


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
async def test_a_body_ending_after_the_finish_keeps_the_whole_answer(
    provider: Provider, server: SSEServer, chunked: bool
) -> None:
    """A body that ends after the finish chunk but before the usage chunk and [DONE] (a
    buffering proxy drops them): the answer is whole, its usage unknown."""
    server.enqueue(sse(*chat_chunks(["Hel", "lo"]), done=False, chunked=chunked))
    completion = await collect(provider)
    assert completion.text == "Hello" and completion.finish_reason == "stop"


async def test_html_200_is_a_provider_error(provider: Provider, server: SSEServer) -> None:
    """A 200 with an HTML page (a proxy's login page) is an error, not an empty answer."""
    server.enqueue(raw(200, b"<html>Gateway login</html>"))
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert caught.value.retryable is True
    if isinstance(provider, OpenAICompatProvider):
        assert "text/html" in str(caught.value)


@pytest.mark.parametrize("mode", ["stream", "complete"])
async def test_content_filter_is_not_retryable(
    provider: Provider, server: SSEServer, mode: str
) -> None:
    """An answer stopped by the content filter fails without a retry."""
    if mode == "stream":
        server.enqueue(sse(*chat_chunks(["Hel"], finish_reason="content_filter")))
        call = call_with_retries(lambda: collect(provider), FAST_RETRY)
    else:
        server.enqueue(json_response(200, completion_json("", finish_reason="content_filter")))
        call = call_with_retries(lambda: provider.complete(REQUEST), FAST_RETRY)
    with pytest.raises(ProviderError, match="content filter") as caught:
        await call
    assert caught.value.retryable is False
    assert len(server.requests) == 1


# -- statuses and retries --------------------------------------------------------------------


async def test_429_retry_after_is_honoured_then_success(
    provider: Provider, server: SSEServer
) -> None:
    """429 with Retry-After: 1 waits about a second, then succeeds on the 2nd request only."""
    server.enqueue(
        json_response(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}),
        sse(*chat_chunks(["ok"])),
    )
    errors: list[BaseException] = []
    started = time.monotonic()
    completion = await retrying(provider, errors)
    assert 0.95 <= time.monotonic() - started < 3.0  # real: a socket to the loopback test server
    assert completion.text == "ok"
    assert len(server.requests) == 2  # the SDK's own retries are off
    [error] = errors
    assert isinstance(error, ProviderError)
    assert (error.status, error.retry_after, error.retryable) == (429, 1.0, True)
    assert "slow down" in str(error)


async def test_500_then_success(provider: Provider, server: SSEServer) -> None:
    """A 500 is retried once and the second answer is returned."""
    server.enqueue(
        json_response(500, {"error": {"message": "boom", "type": "server_error"}}),
        sse(*chat_chunks(["ok"])),
    )
    errors: list[BaseException] = []
    completion = await retrying(provider, errors)
    assert completion.text == "ok"
    assert len(server.requests) == 2
    [error] = errors
    assert isinstance(error, ProviderError)
    assert (error.status, error.retryable) == (500, True)


@pytest.mark.parametrize(
    "events", [[Reset()], [*content_chunks(), Reset()]], ids=["after-headers", "after-role-chunk"]
)
async def test_connection_reset_before_content_is_retried(
    provider: Provider, server: SSEServer, events: list[Event]
) -> None:
    """A TCP reset before any content is a retryable ProviderError; the retry succeeds."""
    server.enqueue(sse(*events), sse(*chat_chunks(["ok"])))
    errors: list[BaseException] = []
    completion = await retrying(provider, errors)
    assert completion.text == "ok"
    assert len(server.requests) == 2
    [error] = errors
    assert isinstance(error, ProviderError)
    assert (error.retryable, error.partial) == (True, False)


async def test_401_is_final_and_never_shows_the_key(
    provider: Provider, server: SSEServer, caplog: pytest.LogCaptureFixture
) -> None:
    """401 fails at once with the server's message; the key is in no error, repr or log line."""
    caplog.set_level(logging.DEBUG)
    message = "Incorrect API key provided: sk-CANA****test."
    server.enqueue(json_response(401, {"error": {"message": message, "code": "invalid_api_key"}}))
    with pytest.raises(ProviderError) as caught:
        await call_with_retries(lambda: collect(provider), FAST_RETRY)
    error = caught.value
    assert (error.status, error.retryable) == (401, False)
    assert "Incorrect API key" in str(error)
    assert len(server.requests) == 1
    shown = [
        str(error),
        repr(error),
        "".join(traceback.format_exception(error)),
        repr(provider),
        str(provider),
        caplog.text,
    ]
    assert "401" in caplog.text  # the clients did log the exchange
    assert not [text for text in shown if CANARY in text]


# -- non-streaming ---------------------------------------------------------------------------


async def test_complete_returns_text_and_usage(provider: Provider, server: SSEServer) -> None:
    """complete() returns the message, finish reason and usage of a non-streamed request."""
    server.enqueue(json_response(200, completion_json("hello", usage=(3, 1))))
    completion = await provider.complete(REQUEST)
    assert (completion.text, completion.finish_reason) == ("hello", "stop")
    assert completion.usage == Usage(3, 1)
    [request] = server.requests
    assert request.json.get("stream") in (None, False)
    assert request.headers["authorization"] == f"Bearer {CANARY}"


@pytest.mark.parametrize(
    "response",
    [json_response(200, completion_json("late"), delay=30.0), sse(Hang())],
    ids=["no-headers", "headers-then-hang"],
)
async def test_complete_hang_ends_at_the_stage_deadline(
    provider: Provider, server: SSEServer, response: Response
) -> None:
    """A hung complete() ends promptly at the stage's hard deadline and lets go of the socket."""
    server.enqueue(response)

    async def under_deadline() -> None:
        async with asyncio.timeout(0.3):
            await provider.complete(REQUEST)

    elapsed, error = await timed(under_deadline())
    assert isinstance(error, TimeoutError), repr(error)
    assert_fired_near(elapsed, 0.3)
    await server.wait_connections_open(0)


# -- no leaks --------------------------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
async def test_timeouts_leak_no_fds_or_tasks(kind: str) -> None:
    """Five idle timeouts in a row leave no file descriptor and no task behind."""
    fds_before = open_fds()
    async with SSEServer() as server:
        provider = make_provider(kind, server)
        try:
            for _ in range(5):
                server.enqueue(sse(*content_chunks("Hel"), Hang()))
                with pytest.raises(StreamIdleTimeout):
                    await collect(provider, timeouts(idle=0.1))
                await server.wait_connections_open(0)
        finally:
            await provider.aclose()
    assert open_fds() <= fds_before + 2
    assert asyncio.all_tasks() == {asyncio.current_task()}


# -- the lean adapter's HTTP exchange, under respx ---------------------------------------------

RESPX_BASE = "http://llm.test/v1"


@pytest.fixture
async def compat() -> AsyncIterator[OpenAICompatProvider]:
    provider = OpenAICompatProvider(
        base_url=RESPX_BASE + "/", api_key=CANARY, model="m", http="httpx"
    )
    yield provider
    await provider.aclose()


async def test_respx_body_and_headers_of_a_full_request(compat: OpenAICompatProvider) -> None:
    """Every set field goes in the body, `extra` merged last; bearer + JSON headers; exact URL."""
    request = ChatRequest(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        model="big",
        temperature=0.2,
        max_tokens=5,
        stop=["\n"],
        extra={"seed": 7, "max_tokens": 9},
    )
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post(f"{RESPX_BASE}/chat/completions").respond(200, json=completion_json("ok"))
        assert (await compat.complete(request)).text == "ok"
    sent = route.calls.last.request
    assert str(sent.url) == f"{RESPX_BASE}/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {CANARY}"
    assert sent.headers["content-type"] == "application/json"
    assert orjson.loads(sent.content) == {
        "model": "big",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "max_tokens": 9,
        "stop": ["\n"],
        "seed": 7,
    }


async def test_respx_unset_fields_stay_out_of_the_body(compat: OpenAICompatProvider) -> None:
    """A bare streamed request carries the default model, the messages and the stream flags only."""
    wire = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chat_chunks(["ok"]))
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post(f"{RESPX_BASE}/chat/completions").respond(
            200, headers={"content-type": "text/event-stream"}, content=wire + b"data: [DONE]\n\n"
        )
        assert (await collect(compat)).text == "ok"
    assert orjson.loads(route.calls.last.request.content) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


@pytest.mark.parametrize("mode", ["stream", "complete"])
async def test_respx_400_surfaces_the_error_message(
    compat: OpenAICompatProvider, mode: str
) -> None:
    """A 400's `error.message` is the error's text; it is not retryable."""
    body = {"error": {"message": "max_tokens is too large: 999999", "type": "invalid_request"}}
    with respx.mock(assert_all_called=True) as mock:
        mock.post(f"{RESPX_BASE}/chat/completions").respond(400, json=body)
        with pytest.raises(ProviderError) as caught:
            await (collect(compat) if mode == "stream" else compat.complete(REQUEST))
    assert caught.value.status == 400
    assert caught.value.retryable is False
    assert "max_tokens is too large: 999999" in str(caught.value)


async def test_respx_transport_error_is_a_retryable_provider_error(
    compat: OpenAICompatProvider,
) -> None:
    """A refused connection is a retryable ProviderError, raised from the httpx error."""
    with respx.mock(assert_all_called=True) as mock:
        mock.post(f"{RESPX_BASE}/chat/completions").mock(
            side_effect=httpx.ConnectError("connection refused")
        )
        with pytest.raises(ProviderError) as caught:
            await collect(compat)
    assert (caught.value.retryable, caught.value.partial) == (True, False)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)
