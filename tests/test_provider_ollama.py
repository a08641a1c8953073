"""The ``ollama`` adapter against the loopback server speaking ``/api/chat`` JSON lines,
under the stream guard, on both HTTP paths; the JSON-lines framer; ``OLLAMA_HOST``."""

from __future__ import annotations

import asyncio
import base64
import functools
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ai_lease.errors import (
    ConfigError,
    FirstTokenTimeout,
    ProviderError,
    StreamIdleTimeout,
    StreamLimitExceeded,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Completion, ToolCall, Usage
from ai_lease.providers.ndjson import EventTooLarge, NDJSONFramer
from ai_lease.providers.ollama import OllamaProvider, ollama_base_url
from ai_lease.retry import MODEL_CALL, call_with_retries
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import RetryPolicy, StreamTimeouts
from tests.harness.ollama_server import (
    chat_json,
    chat_lines,
    done_line,
    error_line,
    line,
    ndjson,
    ollama_error,
    ollama_url,
    thinking_lines,
    tool_call,
)
from tests.harness.sse_server import Cut, Hang, Repeat, Sleep, SSEServer

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
RELAXED = StreamTimeouts(first_token=5.0, idle=5.0, total=10.0)
TIGHT = StreamTimeouts(first_token=0.4, idle=0.3, total=10.0)  # idle < the thinking below
FAST_RETRY = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.05)
PATHS: dict[str, Callable[..., OllamaProvider]] = {
    "aiohttp": functools.partial(OllamaProvider, http="aiohttp"),
    "httpx": functools.partial(OllamaProvider, http="httpx"),
}


RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"  # a UUID4, as X-Request-Id carries it


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=sorted(PATHS))
async def provider(
    request: pytest.FixtureRequest, server: SSEServer
) -> AsyncIterator[OllamaProvider]:
    """The adapter on each HTTP path, pointed at the loopback server."""
    made = PATHS[request.param](base_url=ollama_url(server), model="m")
    yield made
    await made.aclose()


async def collect(
    provider: OllamaProvider, limits: StreamTimeouts = RELAXED, request: ChatRequest = REQUEST
) -> Completion:
    """One guarded streamed call, as the call_ai stage makes it."""
    return await StreamGuard(limits, Progress()).call(provider, request)


async def guarded(provider: OllamaProvider, limits: StreamTimeouts = TIGHT) -> StreamGuard:
    """The guard after one guarded streamed call that is expected to fail (raises)."""
    guard = StreamGuard(limits, Progress())
    await guard.call(provider, REQUEST)
    return guard


# -- the happy path --------------------------------------------------------------------------


async def test_stream_gives_exact_text_finish_and_usage(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """Lines' content joined in order; done_reason stop; prompt_eval_count / eval_count."""
    server.enqueue(ndjson(*chat_lines(["Hel", "lo", " wörld"], usage=(26, 298))))
    completion = await collect(provider)
    assert completion.text == "Hello wörld"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(26, 298)
    assert completion.chunks == 3
    await server.wait_connections_open(1)  # kept alive for the next request


async def test_request_body_path_and_headers(provider: OllamaProvider, server: SSEServer) -> None:
    """POST /api/chat with stream, think, options (temperature, num_predict, stop), format
    from a JSON schema, X-Request-Id; no Authorization without a key."""
    server.enqueue(ndjson(*chat_lines(["{}"])))
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    request = ChatRequest(
        [{"role": "user", "content": "hi"}],
        temperature=0.2,
        max_tokens=64,
        stop=["\n\n"],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        request_id=RID,
        client_request_id="job-1:7:2",
    )
    made = OllamaProvider(base_url=ollama_url(server), model="m", think=True, http=provider.http)
    try:
        await collect(made, request=request)
    finally:
        await made.aclose()
    [sent] = server.requests
    assert (sent.method, sent.path) == ("POST", "/api/chat")
    assert sent.headers["x-request-id"] == RID
    assert "x-client-request-id" not in sent.headers
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "format": schema,
        "options": {"temperature": 0.2, "num_predict": 64, "stop": ["\n\n"]},
        "think": True,
    }


async def test_request_images_tools_and_json_mode(server: SSEServer) -> None:
    """Text parts joined, data: images as base64 ``images``, tools as given, an assistant
    tool call's arguments as an object, json_object as format "json", provider defaults and
    a proxy key as Bearer."""
    png = base64.b64encode(b"\x89PNG fake").decode()
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    request = ChatRequest(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                    {"type": "text", "text": "this?"},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
        ],
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
    )
    server.enqueue(ndjson(*chat_lines(["{}"])))
    made = OllamaProvider(
        base_url=ollama_url(server), model="m", api_key="proxy-key", temperature=0.5, max_tokens=9
    )
    try:
        await collect(made, request=request)
    finally:
        await made.aclose()
    [sent] = server.requests
    assert sent.headers["authorization"] == "Bearer proxy-key"
    user, assistant, tool = sent.json["messages"]
    assert user == {"role": "user", "content": "what is\nthis?", "images": [png]}
    assert assistant["tool_calls"] == [
        {"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}
    ]
    assert tool == {"role": "tool", "content": "42", "tool_call_id": "c1", "tool_name": "f"}
    assert sent.json["tools"] == tools
    assert sent.json["format"] == "json"
    assert sent.json["options"] == {"temperature": 0.5, "num_predict": 9}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tool_choice": "required"}, "cannot force a tool call"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "cannot force"),
        ({"image": "https://example.com/cat.png"}, "inline images only"),
        ({"response_format": {"type": "yaml"}}, "json_schema"),
    ],
    ids=["required", "named", "http-image", "bad-format"],
)
async def test_what_ollama_cannot_take_is_a_config_error(
    server: SSEServer, change: dict[str, Any], words: str
) -> None:
    """A forced tool choice, an image by URL, an unknown response format: ConfigError
    before anything is sent."""
    image = change.pop("image", None)
    content: Any = "hi"
    if image:
        content = [{"type": "image_url", "image_url": {"url": image}}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    request = ChatRequest([{"role": "user", "content": content}], tools=tools, **change)
    made = OllamaProvider(base_url=ollama_url(server), model="m")
    try:
        with pytest.raises(ConfigError, match=words):
            await collect(made, request=request)
    finally:
        await made.aclose()
    assert server.requests == []


async def test_think_levels_and_extra_options_go_out(server: SSEServer) -> None:
    """think "high" (gpt-oss) is sent as is; a request's extra options (num_ctx) merge with
    the sampling options and other extra fields (keep_alive) go at the top level."""
    server.enqueue(ndjson(*chat_lines(["ok"])))
    request = ChatRequest(
        REQUEST.messages, max_tokens=5, extra={"options": {"num_ctx": 8192}, "keep_alive": "10m"}
    )
    made = OllamaProvider(base_url=ollama_url(server), model="m", think="high")
    try:
        await collect(made, request=request)
    finally:
        await made.aclose()
    sent = server.requests[0].json
    assert sent["think"] == "high" and sent["keep_alive"] == "10m"
    assert sent["options"] == {"num_predict": 5, "num_ctx": 8192}
    with pytest.raises(ConfigError, match=r"provider\.think"):
        OllamaProvider(model="m", think="max")  # type: ignore[arg-type]


async def test_tool_choice_none_leaves_the_tools_out(server: SSEServer) -> None:
    """Ollama has no tool_choice: "none" is honoured by not offering the tools."""
    server.enqueue(ndjson(*chat_lines(["ok"])))
    tools = [{"type": "function", "function": {"name": "f"}}]
    made = OllamaProvider(base_url=ollama_url(server), model="m")
    try:
        await collect(made, request=ChatRequest(REQUEST.messages, tools=tools, tool_choice="none"))
    finally:
        await made.aclose()
    assert "tools" not in server.requests[0].json


async def test_tool_calls_are_progress_and_the_completion_carries_them(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """Whole tool calls in a line (arguments an object) become Completion.tool_calls in
    order, ids synthesised where Ollama sends none; finish reason "tool_calls"."""
    calls = [tool_call("weather", {"city": "Paris"}), tool_call("time", {}, id="call_x")]
    server.enqueue(ndjson(line(tool_calls=calls[:1]), line(tool_calls=calls[1:]), done_line()))
    guard = StreamGuard(RELAXED, Progress())
    completion = await guard.call(provider, REQUEST)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == ""
    assert completion.tool_calls == (
        ToolCall("call_0", "weather", '{"city":"Paris"}'),
        ToolCall("call_x", "time", "{}"),
    )
    assert guard.first_token_s is not None and guard.first_visible_s is None


async def test_length_is_a_finish_and_load_is_an_error(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """done_reason "length" is an answer cut at num_predict; "load" (the model was only
    loaded, no answer) is a non-retryable error, not an empty success."""
    server.enqueue(ndjson(*chat_lines(["Hel"], "length")), ndjson(done_line("load", None)))
    completion = await collect(provider)
    assert (completion.text, completion.finish_reason) == ("Hel", "length")
    with pytest.raises(ProviderError, match="only loaded the model") as caught:
        await collect(provider)
    assert caught.value.retryable is False


# -- timeouts ----------------------------------------------------------------------------------


async def test_keep_alive_lines_only_hit_the_first_token_timeout(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """Lines with empty content and done: false every 50 ms are liveness, not progress; the
    connection is closed when the budget fires."""
    server.enqueue(ndjson(*[line(), Sleep(0.05)] * 40, Hang()))
    started = time.monotonic()
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider)
    assert time.monotonic() - started < 5  # real: a socket to the loopback test server
    await server.wait_connections_open(0)


async def test_a_slow_model_load_hits_the_first_token_timeout(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """Ollama sends nothing while it loads a model: no head for longer than first_token is
    a FirstTokenTimeout (loading counts against it), and the connection is closed."""
    server.enqueue(ndjson(*chat_lines(["late"]), delay=30.0))
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider)
    await server.wait_connections_open(0)


async def test_a_stall_mid_stream_is_an_idle_timeout(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """Text, then keep-alive lines, then silence: StreamIdleTimeout keeps what came."""
    server.enqueue(ndjson(line("Hel"), line("lo"), *[Sleep(0.05), line()] * 10, Hang()))
    with pytest.raises(StreamIdleTimeout) as caught:
        await guarded(provider)
    assert (caught.value.chunks, caught.value.text) == (2, "Hello")
    await server.wait_connections_open(0)


async def test_thinking_longer_than_idle_is_not_a_timeout(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """0.8 s of message.thinking against a 0.3 s idle budget completes; thinking is never
    answer text, and the first visible token's time is told apart."""
    server.enqueue(ndjson(*thinking_lines(8, 0.1), Sleep(0.1), *chat_lines(["Paris"])))
    guard = StreamGuard(TIGHT, Progress())
    completion = await guard.call(provider, REQUEST)
    assert (completion.text, completion.finish_reason) == ("Paris", "stop")
    assert guard.first_token_s is not None and guard.first_visible_s is not None
    assert guard.first_visible_s - guard.first_token_s >= 0.7


# -- broken streams ------------------------------------------------------------------------------


@pytest.mark.parametrize("ending", [Cut(), None], ids=["cut", "clean-end"])
async def test_a_stream_without_done_is_an_error(
    provider: OllamaProvider, server: SSEServer, ending: Cut | None
) -> None:
    """A body that ends (cut, or cleanly) before a done: true line is an error naming it,
    partial after content: never a short answer."""
    events: list[Any] = chat_lines(["Hel", "lo"], done_reason=None)
    server.enqueue(ndjson(*events, *([ending] if ending else [])))
    with pytest.raises(ProviderError) as caught:
        await collect(provider)
    assert caught.value.partial is True
    if ending is None:
        assert "before a line with done: true" in str(caught.value)


@pytest.mark.parametrize(("texts", "partial"), [((), False), (("Hel",), True)])
async def test_an_error_line_under_200_is_a_provider_error(
    provider: OllamaProvider, server: SSEServer, texts: tuple[str, ...], partial: bool
) -> None:
    """{"error": …} after a 200 carries Ollama's message; retryable before content (and
    retried), partial after (and not)."""
    server.enqueue(
        ndjson(*[line(t) for t in texts], error_line("model runner has unexpectedly stopped")),
        ndjson(*chat_lines(["ok"])),
    )
    with pytest.raises(ProviderError, match="runner has unexpectedly stopped") as caught:
        await collect(provider)
    assert (caught.value.retryable, caught.value.partial) == (True, partial)
    if not partial:
        server.enqueue(ndjson(error_line("busy")), ndjson(*chat_lines(["ok"])))
        result = await call_with_retries(lambda: collect(provider), FAST_RETRY)
        assert result.text == "ok"


@pytest.mark.parametrize(
    "bad",
    [b"<html>proxy</html>\n", b'{"message": {"tool_calls": [{"name": "f"}]}, "done": false}\n'],
    ids=["not-json", "bad-tool-call"],
)
async def test_a_line_that_is_not_a_chat_line_is_an_error(
    provider: OllamaProvider, server: SSEServer, bad: bytes
) -> None:
    """Garbage, or a tool call without its function, is a retryable ProviderError."""
    server.enqueue(ndjson(line("Hel"), bad, done_line()))
    with pytest.raises(ProviderError, match="malformed line") as caught:
        await collect(provider)
    assert caught.value.partial is True


@pytest.mark.parametrize(
    ("status", "message"),
    [(400, 'invalid format: expected "json" or a JSON schema'), (404, 'model "m" not found')],
)
async def test_client_errors_fail_at_once_with_ollamas_message(
    provider: OllamaProvider, server: SSEServer, status: int, message: str
) -> None:
    """400 / 404 are not retried, and say what Ollama said."""
    server.enqueue(ollama_error(status, message), ndjson(*chat_lines(["never"])))
    with pytest.raises(ProviderError) as caught:
        await call_with_retries(lambda: collect(provider), FAST_RETRY)
    assert caught.value.status == status and caught.value.retryable is False
    assert message in str(caught.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_busy_and_server_errors_are_retryable(
    provider: OllamaProvider, server: SSEServer, status: int
) -> None:
    """429 / 500 / 503 (Ollama's "server busy") are retryable with the message kept."""
    server.enqueue(ollama_error(status, "server busy, please try again."))
    with pytest.raises(ProviderError, match="server busy") as caught:
        await collect(provider)
    assert (caught.value.status, caught.value.retryable) == (status, True)


async def test_a_503_is_retried_under_model_call_then_succeeds(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """call_with_retries with the MODEL_CALL policy calls again after a 503 and gets the
    answer from the second request."""
    server.enqueue(ollama_error(503, "server busy"), ndjson(*chat_lines(["ok"])))
    retried: list[BaseException] = []
    result = await call_with_retries(
        lambda: collect(provider), MODEL_CALL, on_retry=lambda e, _w: retried.append(e)
    )
    assert result.text == "ok"
    assert len(server.requests) == 2 and len(retried) == 1


async def test_a_200_that_is_not_ndjson_is_refused(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """A 200 of another content type (a proxy's page) is a retryable error naming both."""
    server.enqueue(ndjson(*chat_lines(["x"]), content_type="text/html"))
    with pytest.raises(ProviderError, match="expected application/x-ndjson"):
        await collect(provider)


async def test_an_endless_line_is_refused_with_bounded_memory(server: SSEServer) -> None:
    """A line that never ends: StreamLimitExceeded soon, memory bounded, connection closed."""
    limit = 256 * 1024
    server.enqueue(ndjson(b'{"message": {"content": "', Repeat(b"x" * 16384)))
    made = OllamaProvider(base_url=ollama_url(server), model="m", max_event_bytes=limit)
    tracemalloc.start()
    try:
        async with asyncio.timeout(15):
            with pytest.raises(StreamLimitExceeded) as caught:
                await collect(made)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await made.aclose()
    assert (caught.value.limit, caught.value.retryable) == ("max_event_bytes", False)
    assert peak < 32 * limit, f"peak {peak} bytes for a {limit}-byte limit"
    await server.wait_connections_open(0)


# -- not streamed --------------------------------------------------------------------------------


async def test_complete_posts_stream_false_and_reads_one_object(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """complete(): stream false, one JSON object with text, finish, usage and tool calls."""
    calls = [tool_call("f", {"x": 1})]
    server.enqueue(chat_json("Paris", usage=(5, 1)), chat_json("", tool_calls=calls))
    completion = await provider.complete(REQUEST)
    assert server.requests[0].json["stream"] is False
    assert (completion.text, completion.finish_reason) == ("Paris", "stop")
    assert completion.usage == Usage(5, 1)
    tools = await provider.complete(REQUEST)
    assert tools.finish_reason == "tool_calls"
    assert tools.tool_calls == (ToolCall("call_0", "f", '{"x":1}'),)


async def test_complete_errors_keep_ollamas_message(
    provider: OllamaProvider, server: SSEServer
) -> None:
    """A 404 to a call that is not streamed says what Ollama said, not retryable."""
    server.enqueue(ollama_error(404, 'model "m" not found, try pulling it first'))
    with pytest.raises(ProviderError, match="try pulling it first") as caught:
        await provider.complete(REQUEST)
    assert caught.value.retryable is False


# -- the framer ---------------------------------------------------------------------------------


def fed(framer: NDJSONFramer, *reads: bytes) -> list[bytes]:
    """Every line the framer gives for ``reads``, then at the body's end."""
    out = [payload for raw in reads for payload in framer.feed(raw)]
    return out + framer.close()


def test_framer_joins_lines_split_across_reads() -> None:
    """A line in pieces over several reads comes out once, whole; several in one read too."""
    assert fed(NDJSONFramer(), b'{"a"', b": 1", b"}\n{", b'"b": 2}\n{"c": 3}\n') == [
        b'{"a": 1}',
        b'{"b": 2}',
        b'{"c": 3}',
    ]


def test_framer_drops_crlf_and_blank_lines() -> None:
    """\\r\\n ends a line (even split between reads); blank and whitespace lines are skipped."""
    assert fed(NDJSONFramer(), b"\n\r\n", b'{"a": 1}\r', b"\n  \n", b'{"b": 2}\r\n') == [
        b'{"a": 1}',
        b'{"b": 2}',
    ]


def test_framer_close_gives_a_last_line_without_newline() -> None:
    """At the body's end, an unterminated last line is handed over for the parser to judge."""
    framer = NDJSONFramer()
    assert framer.feed(b'{"a": 1}\n{"done": tr') == [b'{"a": 1}']
    assert framer.feed(b"ue}") == []
    assert framer.close() == [b'{"done": true}']
    assert framer.close() == []


@pytest.mark.parametrize(
    "reads",
    [
        [b"x" * 11],
        [b"x" * 6, b"x" * 6],
        [b"x" * 5, b"x" * 6 + b"\n"],
        [b"ok\n" + b"x" * 11 + b"\n"],
    ],
    ids=["one-read", "pieces", "pieces-ended", "whole-lines"],
)
def test_framer_refuses_a_line_past_the_limit(reads: list[bytes]) -> None:
    """A line over max_event_bytes raises EventTooLarge as soon as it is past the limit."""
    framer = NDJSONFramer(10)
    with pytest.raises(EventTooLarge):
        for raw in reads:
            framer.feed(raw)
    assert fed(NDJSONFramer(10), b"x" * 10 + b"\n") == [b"x" * 10]


def test_framer_is_linear_in_bytes() -> None:
    """100,000 tiny reads of one long line take time proportional to the bytes: the pending
    line is kept in pieces, never joined again per read."""
    framer = NDJSONFramer(8 * 1024 * 1024)
    started = time.perf_counter()
    for _ in range(100_000):
        framer.feed(b"xx")
    assert framer.feed(b"\n") == [b"xx" * 100_000]
    assert time.perf_counter() - started < 5  # real: the CPU time of the framer is what is bounded


# -- OLLAMA_HOST ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://127.0.0.1:11434"),
        ("0.0.0.0:8080", "http://127.0.0.1:8080"),
        ('"127.0.0.1:9000" ', "http://127.0.0.1:9000"),
        (":56789", "http://127.0.0.1:56789"),
        ("gpu-box", "http://gpu-box:11434"),
        ("gpu-box:8080", "http://gpu-box:8080"),
        ("http://gpu-box", "http://gpu-box:80"),
        ("https://ollama.example.com", "https://ollama.example.com:443"),
        ("https://ollama.example.com:8443/ollama/", "https://ollama.example.com:8443/ollama"),
        ("example.com/path", "http://example.com:11434/path"),
        ("[::1]:9", "http://[::1]:9"),
        ("::", "http://[::1]:11434"),
        ("[0001:002:003:0004::1]", "http://[1:2:3:4::1]:11434"),
    ],
)
def test_ollama_host_is_read_as_ollama_reads_it(value: str, url: str) -> None:
    """OLLAMA_HOST forms (Ollama's clients' defaults; a bind-all address dials loopback)."""
    assert ollama_base_url(value) == url


@pytest.mark.parametrize("value", ["gpu-box:99999", "ftp://gpu-box", "gpu-box:port"])
def test_a_bad_ollama_host_is_a_config_error(value: str) -> None:
    """A port out of range or a scheme other than http(s) is refused, naming OLLAMA_HOST."""
    with pytest.raises(ConfigError, match="OLLAMA_HOST"):
        ollama_base_url(value)


async def test_base_url_may_be_given_as_a_host_and_the_key_never_shows() -> None:
    """A base_url without a scheme is read as OLLAMA_HOST; repr shows the URL, never a key."""
    made = OllamaProvider(base_url="gpu-box:8080", api_key="sk-CANARY", model="m")
    await made.aclose()
    assert "http://gpu-box:8080/api/chat" in repr(made)
    assert "CANARY" not in repr(made)
