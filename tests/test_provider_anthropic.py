"""The ``anthropic`` adapter against a loopback server speaking the Messages API's wire shape.

Streams are driven through the stream guard, on both HTTP paths (aiohttp and httpx).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    FirstTokenTimeout,
    ProviderError,
    StreamIdleTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import ChatRequest, Completion, ToolCall, Usage
from ai_lease.providers.sse import EventTooLarge, SSEFramer
from ai_lease.retry import MODEL_CALL, RetryPolicy, call_with_retries, is_transient
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts
from tests.harness.anthropic_server import (
    anthropic_url,
    error_event,
    error_response,
    event,
    message_end,
    message_events,
    message_json,
    message_start,
    messages_sse,
    ping,
    text_block,
    thinking_block,
    tool_block,
)
from tests.harness.sse_server import Cut, Event, Hang, Sleep, SSEServer, json_response

KEY = "sk-ant-test-0123456789abcdef"
RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"  # a UUID4, as X-Request-Id carries it
REQUEST = ChatRequest(
    [{"role": "user", "content": "hi"}], request_id=RID, client_request_id="job-1:7:1"
)
TIGHT = StreamTimeouts(first_token=0.4, idle=0.3, total=10.0)
FAST = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=["aiohttp", "httpx"])
async def provider(
    request: pytest.FixtureRequest, server: SSEServer
) -> AsyncIterator[AnthropicProvider]:
    made = AnthropicProvider(
        base_url=anthropic_url(server), api_key=KEY, model="claude-test", http=request.param
    )
    yield made
    await made.aclose()


async def guarded(
    provider: AnthropicProvider, request: ChatRequest = REQUEST, limits: StreamTimeouts = TIGHT
) -> tuple[StreamGuard, Completion]:
    guard = StreamGuard(limits, Progress())
    return guard, await guard.call(provider, request)


async def test_normal_stream_exact_text_and_usage(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """Thinking, pings and text interleaved: the answer is the text only, with the usage."""
    events: list[Event] = [
        message_start(25),
        ping(),
        *thinking_block(0, ["Let me ", "think."]),
        ping(),
        *text_block(1, ["Hel", "lo", " world"]),
        *message_end("end_turn", 15),
    ]
    server.enqueue(messages_sse(*events))
    guard, completion = await guarded(provider)
    assert completion.text == "Hello world"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(25, 15)
    assert completion.chunks == 3
    assert guard.first_token_s is not None and guard.first_visible_s is not None


async def test_ping_only_stream_is_a_first_token_timeout(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """Pings, block starts, empty deltas, a signature and a tool's name are liveness: no
    first token, and the connection is closed."""
    pings: list[Event] = [
        message_start(),
        *thinking_block(0, [""]),  # an empty thought and a signature: liveness only
        *text_block(1, [""]),
        *tool_block(2, "toolu_1", "f", [""]),  # a tool's name, no arguments yet
    ]
    for _ in range(10):
        pings += [Sleep(0.1), ping()]
    server.enqueue(messages_sse(*pings, Hang()))
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider)
    await server.wait_connections_open(0)


async def test_stall_mid_stream_is_an_idle_timeout(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """Text, then pings only: the idle budget fires and the connection is closed."""
    events: list[Event] = [message_start(), *text_block(0, ["Hel"])[:2]]
    for _ in range(8):
        events += [Sleep(0.1), ping()]
    server.enqueue(messages_sse(*events, Hang()))
    with pytest.raises(StreamIdleTimeout) as caught:
        await guarded(provider)
    assert caught.value.text == "Hel"
    await server.wait_connections_open(0)


async def test_thinking_longer_than_idle_is_progress(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """0.8 s of thinking_delta against a 0.3 s idle / 0.4 s first-token budget completes."""
    events = [
        message_start(),
        *thinking_block(0, [f"step {i}. " for i in range(8)], every=0.1),
        Sleep(0.1),
        *text_block(1, ["Paris"]),
        *message_end(),
    ]
    server.enqueue(messages_sse(*events))
    guard, completion = await guarded(provider)
    assert completion.text == "Paris"
    assert guard.first_token_s is not None and guard.first_visible_s is not None
    assert guard.first_visible_s - guard.first_token_s >= 0.6


async def test_a_body_ending_after_the_stop_reason_keeps_the_whole_answer(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """A body that ends after message_delta's stop reason but before message_stop (a
    buffering proxy drops the last event): the answer is whole — its stop reason says so."""
    events: list[Event] = [message_start(), *text_block(0, ["Hel", "lo"]), message_end()[0]]
    server.enqueue(messages_sse(*events))
    _, completion = await guarded(provider)
    assert completion.text == "Hello" and completion.finish_reason == "stop"


@pytest.mark.parametrize("tail", ["no-stop-reason", "cut"])
async def test_truncated_before_message_stop_is_an_error(
    server: SSEServer, provider: AnthropicProvider, tail: str
) -> None:
    """A body that ends before any stop reason (or is cut mid-text) is a partial error,
    never a short answer; a cut connection is let go."""
    events: list[Event] = [message_start(), *text_block(0, ["Hel", "lo"])]
    if tail == "cut":
        events = [*events[:3], Cut()]
    server.enqueue(messages_sse(*events))
    with pytest.raises(ProviderError, match=r"message_stop|ended|Payload|incomplete") as caught:
        await guarded(provider)
    assert caught.value.partial
    assert not is_transient(caught.value)
    if tail == "cut":  # a clean body end leaves a reusable kept-alive connection
        await server.wait_connections_open(0)


async def test_no_events_at_all_is_an_empty_event_stream(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """A 200 event stream that ends with no event is EmptyEventStream (not retried)."""
    server.enqueue(messages_sse())
    with pytest.raises(EmptyEventStream):
        await guarded(provider)


async def test_error_event_before_content_is_retryable(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """overloaded_error after the 200, before any text: retryable, not partial, and a
    retry within the stage gets the whole answer."""
    server.enqueue(
        messages_sse(message_start(), ping(), error_event("overloaded_error", "Overloaded")),
        messages_sse(*message_events(["fine"])),
    )
    with pytest.raises(ProviderError, match="overloaded_error: Overloaded") as caught:
        await guarded(provider)
    assert caught.value.retryable and not caught.value.partial
    completion = await call_with_retries(lambda: guarded(provider), FAST)
    assert completion[1].text == "fine"


async def test_error_event_after_content_is_not_resumed(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """An error event after text: partial, so call_with_retries does not call again."""
    events = [message_start(), *text_block(0, ["Hal", "f"])[:3], error_event()]
    server.enqueue(messages_sse(*events), messages_sse(*message_events(["whole"])))
    with pytest.raises(ProviderError, match="overloaded_error") as caught:
        await call_with_retries(lambda: guarded(provider), FAST)
    assert caught.value.partial
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_client_errors_fail_at_once(
    server: SSEServer, provider: AnthropicProvider, status: int
) -> None:
    """4xx: one request, not retryable, the provider's message kept, the key never shown."""
    server.enqueue(error_response(status, f"bad thing {status}"), *[messages_sse()] * 2)
    with pytest.raises(ProviderError, match=f"HTTP {status}: bad thing {status}") as caught:
        await call_with_retries(lambda: guarded(provider), FAST)
    assert not caught.value.retryable and caught.value.status == status
    assert len(server.requests) == 1
    assert KEY not in str(caught.value) and KEY not in repr(caught.value)


@pytest.mark.parametrize("status", [429, 529])
async def test_rate_limit_and_overload_honour_retry_after(
    server: SSEServer, provider: AnthropicProvider, status: int
) -> None:
    """429 / 529 carry the retry-after and are retried within a deadline: then a good
    stream succeeds, after waiting at least the retry-after."""
    server.enqueue(error_response(status, "Overloaded", {"retry-after": "0.3"}))
    with pytest.raises(ProviderError) as caught:
        await guarded(provider)
    assert caught.value.retryable and caught.value.retry_after == pytest.approx(0.3)
    server.enqueue(
        error_response(status, "Overloaded", {"retry-after": "0.3"}),
        messages_sse(*message_events(["ok"])),
    )
    started = time.monotonic()
    _, completion = await call_with_retries(
        lambda: guarded(provider), MODEL_CALL, deadline_at=time.monotonic() + 5
    )
    assert completion.text == "ok"
    assert 0.25 < time.monotonic() - started < 5  # real: a socket to the loopback test server


async def test_retry_after_past_the_deadline_is_not_waited_for(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """A 529 asking for 3 s with 0.5 s left in the stage: raised at once, one request."""
    server.enqueue(error_response(529, "Overloaded", {"retry-after": "3"}))
    started = time.monotonic()
    with pytest.raises(ProviderError, match="HTTP 529"):
        await call_with_retries(
            lambda: guarded(provider), MODEL_CALL, deadline_at=time.monotonic() + 0.5
        )
    assert time.monotonic() - started < 2  # real: a socket to the loopback test server
    assert len(server.requests) == 1


async def test_request_fault_error_event_is_not_retryable(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """An invalid_request_error event after the 200 is the request's fault: not retried."""
    server.enqueue(messages_sse(message_start(), error_event("invalid_request_error", "too long")))
    with pytest.raises(ProviderError, match="invalid_request_error: too long") as caught:
        await guarded(provider)
    assert not caught.value.retryable


async def test_request_headers_and_translated_body(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """x-api-key, anthropic-version, X-Request-Id; system, image parts, tools, tool results
    and tool_choice in Anthropic's shapes; max_tokens defaulted."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "Thanks"},
    ]
    request = ChatRequest(
        messages,
        tools=tools,
        tool_choice="required",
        request_id=RID,
        client_request_id="job-1:7:2",
        stop=["END"],
    )
    server.enqueue(messages_sse(*message_events(["ok"])))
    await guarded(provider, request)
    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.headers["x-request-id"] == RID
    assert "x-client-request-id" not in sent.headers
    body = sent.json
    assert body["stream"] is True and body["max_tokens"] == 4096
    assert body["system"] == "Be brief." and body["stop_sequences"] == ["END"]
    assert body["tools"] == [
        {
            "name": "weather",
            "description": "Weather of a city",
            "input_schema": tools[0]["function"]["parameters"],  # type: ignore[index]
        }
    ]
    assert body["tool_choice"] == {"type": "any"}
    user, assistant, results = body["messages"]
    assert user["content"][1] == {
        "type": "image",
        "source": {"type": "url", "url": "https://x.test/a.png"},
    }
    assert user["content"][2]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": "iVBO",
    }
    assert assistant["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    ]
    assert results == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "text", "text": "Thanks"},
        ],
    }


async def test_tool_use_stream_is_assembled(server: SSEServer, provider: AnthropicProvider) -> None:
    """input_json_delta fragments (slower than the idle budget) assemble into the call (a
    server tool's input is not one); the tool_use stop is a "tool_calls" finish."""
    fragments = ['{"ci', 'ty": ', '"Par', 'is"}']
    head, *deltas, stop = tool_block(1, "toolu_9", "weather", fragments)
    paced: list[Event] = []
    for delta in deltas:
        paced += [Sleep(0.12), delta]
    server_tool = [  # a tool Anthropic runs itself: its input is not a call of ours
        event(
            {
                "type": "content_block_start",
                "index": 2,
                "content_block": {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {},
                },
            }
        ),
        event(
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"query": "x"}'},
            }
        ),
        event({"type": "content_block_stop", "index": 2}),
    ]
    events = [message_start(), *text_block(0, ["Checking."]), head, *paced, stop, *server_tool]
    server.enqueue(messages_sse(*events, *message_end("tool_use", 30)))
    _, completion = await guarded(provider)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == "Checking."
    assert completion.tool_calls == (ToolCall("toolu_9", "weather", '{"city": "Paris"}'),)


async def test_json_schema_answer_is_a_forced_tool_read_as_text(
    server: SSEServer, provider: AnthropicProvider
) -> None:
    """response_format json_schema is sent as one forced tool; its input comes back as the
    answer text with a "stop" finish."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    request = ChatRequest([{"role": "user", "content": "a?"}], response_format=fmt)
    events = [message_start(), *tool_block(0, "toolu_1", "ai_lease_json_answer", ['{"a"', ": 1}"])]
    server.enqueue(messages_sse(*events, *message_end("tool_use")))
    _, completion = await guarded(provider, request)
    assert (completion.text, completion.finish_reason, completion.tool_calls) == (
        '{"a": 1}',
        "stop",
        (),
    )
    body = server.requests[0].json
    assert body["tool_choice"] == {"type": "tool", "name": "ai_lease_json_answer"}
    assert body["tools"][0]["input_schema"] == schema


@pytest.mark.parametrize(
    ("reason", "finish"), [("max_tokens", "length"), ("stop_sequence", "stop")]
)
async def test_stop_reasons_are_normalised(
    server: SSEServer, provider: AnthropicProvider, reason: str, finish: str
) -> None:
    """max_tokens is "length", stop_sequence is "stop"."""
    server.enqueue(messages_sse(*message_events(["cut"], stop_reason=reason)))
    _, completion = await guarded(provider)
    assert completion.finish_reason == finish


async def test_refusal_fails_not_retryable(server: SSEServer, provider: AnthropicProvider) -> None:
    """A refusal stop reason is a non-retryable error, not an answer."""
    server.enqueue(messages_sse(*message_events(["I can't"], stop_reason="refusal")))
    with pytest.raises(ProviderError, match="refused") as caught:
        await guarded(provider)
    assert not caught.value.retryable


async def test_complete_reads_text_usage_and_tool_calls(server: SSEServer) -> None:
    """Not streamed: text (thinking left out), usage and tool calls of one message."""
    provider = AnthropicProvider(base_url=anthropic_url(server), api_key=KEY, model="m")
    body = message_json(
        "Hello",
        (12, 7),
        thinking="hmm",
        tool_uses=[("toolu_2", "weather", {"city": "Oslo"})],
        stop_reason="tool_use",
    )
    server.enqueue(json_response(200, body))
    try:
        completion = await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    assert completion.text == "Hello" and completion.finish_reason == "tool_calls"
    assert completion.usage == Usage(12, 7)
    assert completion.tool_calls == (ToolCall("toolu_2", "weather", '{"city":"Oslo"}'),)
    assert "stream" not in server.requests[0].json
    assert server.requests[0].headers["x-request-id"] == RID
    assert "x-client-request-id" not in server.requests[0].headers


async def test_complete_http_error_keeps_the_message_and_hides_the_key(server: SSEServer) -> None:
    """A 529 on a non-streamed call is retryable with its retry-after; a 401 that echoes
    the key shows it masked."""
    provider = AnthropicProvider(base_url=anthropic_url(server), api_key=KEY, model="m")
    server.enqueue(
        error_response(529, "Overloaded", {"retry-after": "2"}),
        error_response(401, f"invalid x-api-key {KEY}"),
    )
    try:
        with pytest.raises(ProviderError, match="HTTP 529: Overloaded") as overloaded:
            await provider.complete(REQUEST)
        with pytest.raises(ProviderError, match="HTTP 401") as denied:
            await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    assert overloaded.value.retryable and overloaded.value.retry_after == 2.0
    assert not denied.value.retryable
    assert KEY not in str(denied.value) and KEY not in repr(provider)


def test_anthropic_api_needs_a_key() -> None:
    """No key for api.anthropic.com is a ConfigError naming ANTHROPIC_API_KEY."""
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider(model="m")


def test_tools_and_response_format_together_are_refused() -> None:
    """A JSON answer is itself a forced tool: with other tools it is a ConfigError."""
    provider = AnthropicProvider(api_key=KEY, model="m")
    tool = {"type": "function", "function": {"name": "f"}}
    request = ChatRequest(
        [{"role": "user", "content": "x"}], tools=[tool], response_format={"type": "json_object"}
    )
    with pytest.raises(ConfigError, match="response_format"):
        provider.stream_request(request)


def _framed(framer: SSEFramer, body: bytes, size: int) -> list[bytes]:
    out: list[bytes] = []
    for start in range(0, len(body), size):
        out += framer.feed(body[start : start + size])
    return out + framer.close()


def test_named_events_frame_the_same_whole_or_in_pieces() -> None:
    """A read that is one named event (the framer's fast path) gives the payloads the
    line-by-line path gives for the same bytes in any pieces (CRLF and a comment included),
    and keeps the event size limit."""
    events = [*message_events(["Hel", "lo"]), b": keep-alive\n\n", b"event: a\r\ndata: {}\r\n\r\n"]
    body = b"".join(events)
    whole = _framed(SSEFramer(4096), body, 1)  # one byte per read: never the fast path
    assert [p for e in events for p in SSEFramer(4096).feed(e)] == whole
    for size in (2, 7, 50, 121, len(body)):
        assert _framed(SSEFramer(4096), body, size) == whole
    with pytest.raises(EventTooLarge):
        SSEFramer(10).feed(ping())
