"""The native Gemini adapter against a loopback server speaking Gemini's wire shape.

Streams go through the stream guard on both HTTP paths (aiohttp and httpx): what counts as
progress (text, thoughts, whole function calls), what is liveness only, the end of the body
after a ``finishReason`` as the only end marker, Google's errors, and the request itself.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    FirstTokenTimeout,
    ProviderError,
    StreamIdleTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers import create_provider
from ai_lease.providers.base import ChatRequest, Completion, ToolCall, Usage
from ai_lease.providers.gemini import SKIP_SIGNATURE, GeminiProvider, request_body
from ai_lease.providers.sse import EventTooLarge, SSEFramer
from ai_lease.retry import MODEL_CALL, call_with_retries
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts
from tests.harness.gemini_server import (
    call_part,
    gemini_error,
    gemini_event,
    gemini_response,
    gemini_sse,
    gemini_stream,
    response_json,
    thinking,
)
from tests.harness.sse_server import Event, Hang, Sleep, SSEServer

KEY = "AIzaSy-test-secret-key"
RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"  # a UUID4, as X-Request-Id carries it
REQUEST = ChatRequest(
    [{"role": "user", "content": "hi"}], request_id=RID, client_request_id="job-1:7:1"
)
TIGHT = StreamTimeouts(first_token=0.4, idle=0.3, total=10.0)
EMPTY = gemini_event({"candidates": [{"content": {"parts": [], "role": "model"}, "index": 0}]})


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=["aiohttp", "httpx"])
async def provider(
    request: pytest.FixtureRequest, server: SSEServer
) -> AsyncIterator[GeminiProvider]:
    made = GeminiProvider(
        base_url=server.base_url, api_key=KEY, model="gemini-test", http=request.param
    )
    yield made
    await made.aclose()


async def guarded(
    provider: GeminiProvider, request: ChatRequest = REQUEST
) -> tuple[StreamGuard, Completion]:
    """The guard after one guarded streamed call, and the call's completion."""
    guard = StreamGuard(TIGHT, Progress())
    return guard, await guard.call(provider, request)


# -- normal streams ------------------------------------------------------------------


async def test_stream_text_thoughts_and_usage(server: SSEServer, provider: GeminiProvider) -> None:
    """Thought parts are reasoning, not text; the answer is the text parts exactly; usage
    counts thoughts in the output and apart; the body's end after STOP is a whole answer."""
    server.enqueue(
        gemini_sse(*gemini_stream(["Hel", "lo ", "world"], thoughts=["hmm. "], usage=(7, 3, 11)))
    )
    guard, completion = await guarded(provider)
    assert completion.text == "Hello world"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(prompt_tokens=7, completion_tokens=14, reasoning_tokens=11)
    assert completion.chunks == 3
    assert guard.first_token_s is not None and guard.first_visible_s is not None


async def test_max_tokens_is_length(server: SSEServer, provider: GeminiProvider) -> None:
    """MAX_TOKENS is a whole (cut short) answer: finish reason "length"."""
    server.enqueue(gemini_sse(*gemini_stream(["Hel", "lo"], finish_reason="MAX_TOKENS")))
    _, completion = await guarded(provider)
    assert (completion.text, completion.finish_reason) == ("Hello", "length")


async def test_usage_after_the_finish_is_kept(server: SSEServer, provider: GeminiProvider) -> None:
    """A usage-only event after the finishReason event still sets the usage."""
    usage_only = {"usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1}}
    server.enqueue(gemini_sse(*gemini_stream(["ok"]), gemini_event(usage_only)))
    _, completion = await guarded(provider)
    assert completion.text == "ok" and completion.usage == Usage(2, 1, 0)


async def test_function_calls_are_tool_calls(server: SSEServer, provider: GeminiProvider) -> None:
    """Whole functionCall parts are tool calls with synthesised ids, arguments as JSON
    text; STOP after them is "tool_calls"."""
    calls = [("weather", {"city": "Paris"}), ("time", {})]
    server.enqueue(gemini_sse(*gemini_stream([], calls=calls, usage=(5, 4, 0))))
    guard, completion = await guarded(provider)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == ""
    assert completion.tool_calls == (
        ToolCall("call_0", "weather", '{"city":"Paris"}'),
        ToolCall("call_1", "time", "{}"),
    )
    assert guard.first_visible_s is None


# -- progress and liveness --------------------------------------------------------------


async def test_keep_alives_only_is_a_first_token_timeout(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """SSE comments, responses with no candidates and candidates with no parts or empty text
    are liveness, not progress: the first-token budget fires, and the connection is closed."""
    events: list[Event] = []
    for _ in range(8):
        events += [Sleep(0.1), b": keep-alive\r\n\r\n", gemini_event({"modelVersion": "m"}), EMPTY]
        events.append(gemini_event(gemini_response([{"text": ""}])))
    server.enqueue(gemini_sse(*events, Hang()))
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider)
    await server.wait_connections_open(0)


async def test_stall_mid_stream_is_an_idle_timeout(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """Text, then silence: the idle budget fires with the text so far, the connection closed."""
    server.enqueue(gemini_sse(*gemini_stream(["Hel", "lo"], finish_reason=None), Hang()))
    with pytest.raises(StreamIdleTimeout) as caught:
        await guarded(provider)
    assert caught.value.text == "Hello"
    await server.wait_connections_open(0)


async def test_thinking_longer_than_idle_is_progress(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """0.8 s of thought parts against a 0.3 s idle and 0.4 s first-token budget: no timeout;
    the first visible token is told apart from the first thought."""
    server.enqueue(gemini_sse(*thinking(8, 0.1), Sleep(0.1), *gemini_stream(["Paris"])))
    guard, completion = await guarded(provider)
    assert (completion.text, completion.finish_reason) == ("Paris", "stop")
    assert guard.first_token_s is not None and guard.first_visible_s is not None
    assert guard.first_visible_s - guard.first_token_s >= 0.7


# -- ends and failures in the stream -------------------------------------------------


async def test_body_ending_without_finish_reason_is_an_error(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """A clean end of the body with no finishReason is truncation, never a short success."""
    server.enqueue(gemini_sse(*gemini_stream(["Hel", "lo"], finish_reason=None)))
    with pytest.raises(ProviderError, match="finishReason") as caught:
        await guarded(provider)
    assert caught.value.retryable and caught.value.partial


async def test_empty_body_is_an_empty_event_stream(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """A 200 event stream with no event at all is not an answer (and not retried)."""
    server.enqueue(gemini_sse())
    with pytest.raises(EmptyEventStream):
        await guarded(provider)


@pytest.mark.parametrize("reason", ["SAFETY", "RECITATION", "MALFORMED_FUNCTION_CALL"])
async def test_other_finish_reasons_fail_with_the_reason(
    server: SSEServer, provider: GeminiProvider, reason: str
) -> None:
    """A finish other than STOP / MAX_TOKENS fails, not retried, naming Gemini's reason."""
    server.enqueue(gemini_sse(*gemini_stream(["Some"], finish_reason=reason)))
    with pytest.raises(ProviderError, match=f"finishReason {reason}") as caught:
        await guarded(provider)
    assert not caught.value.retryable


async def test_blocked_prompt_fails_with_the_block_reason(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """promptFeedback.blockReason (no candidates at all) fails, not retried, naming it."""
    server.enqueue(
        gemini_sse(gemini_event({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}))
    )
    with pytest.raises(ProviderError, match="blockReason PROHIBITED_CONTENT") as caught:
        await guarded(provider)
    assert not caught.value.retryable


async def test_error_event_under_200_is_a_provider_error(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """An {"error": …} event after text is a retryable (503) error marked partial."""
    error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
    server.enqueue(gemini_sse(*gemini_stream(["Hel"], finish_reason=None), gemini_event(error)))
    with pytest.raises(ProviderError, match="overloaded") as caught:
        await guarded(provider)
    assert caught.value.retryable and caught.value.partial


# -- HTTP errors -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_client_errors_fail_at_once_with_googles_message(
    server: SSEServer, provider: GeminiProvider, status: int
) -> None:
    """400/401/403/404 are not retried: one request, Google's message in the error."""
    server.enqueue(
        gemini_error(status, f"API key not valid ({status}). Please pass a valid API key.")
    )
    with pytest.raises(ProviderError, match="API key not valid") as caught:
        await call_with_retries(lambda: guarded(provider), MODEL_CALL)
    assert caught.value.status == status and not caught.value.retryable
    assert len(server.requests) == 1


@pytest.mark.parametrize(("status", "retry_after"), [(429, 2.0), (500, None), (503, 1.0)])
async def test_server_errors_are_retryable(
    server: SSEServer, provider: GeminiProvider, status: int, retry_after: float | None
) -> None:
    """429/500/503 are retryable, with the server's Retry-After when it gives one."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after else None
    server.enqueue(gemini_error(status, "Resource has been exhausted", headers))
    with pytest.raises(ProviderError, match="exhausted") as caught:
        await guarded(provider)
    assert caught.value.retryable and caught.value.retry_after == retry_after


async def test_503_is_retried_then_succeeds_within_the_deadline(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """A 503, then a whole stream: call_with_retries with MODEL_CALL answers within 5 s."""
    server.enqueue(
        gemini_error(503, "The model is overloaded."), gemini_sse(*gemini_stream(["ok"]))
    )
    started = time.monotonic()
    _, completion = await call_with_retries(
        lambda: guarded(provider), MODEL_CALL, deadline_at=started + 5.0
    )
    assert completion.text == "ok" and len(server.requests) == 2
    assert time.monotonic() - started < 5.0  # real: a socket to the loopback test server


# -- the request -----------------------------------------------------------------------


async def test_request_url_headers_and_key(server: SSEServer, provider: GeminiProvider) -> None:
    """The stream goes to :streamGenerateContent?alt=sse, the key in x-goog-api-key and
    never in the URL, with the X-Request-Id."""
    server.enqueue(gemini_sse(*gemini_stream(["ok"])))
    await guarded(provider)
    sent = server.requests[0]
    assert sent.path == "/v1/models/gemini-test:streamGenerateContent?alt=sse"
    assert KEY not in sent.path
    assert sent.headers["x-goog-api-key"] == KEY
    assert sent.headers["x-request-id"] == RID
    assert "x-client-request-id" not in sent.headers
    assert sent.json["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert sent.json["generationConfig"] == {"thinkingConfig": {"includeThoughts": True}}


async def test_request_body_is_translated(server: SSEServer, provider: GeminiProvider) -> None:
    """System, images (URL and data:), tool calls and results, tools, tool choice, JSON
    schema and sampling settings come out in Gemini's shapes."""
    png = base64.b64encode(b"\x89PNG fake").decode()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "additionalProperties": False,
    }
    tool = {
        "type": "function",
        "function": {"name": "weather", "description": "d", "parameters": schema},
    }
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png?x=1"}},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'},
    ]
    request = ChatRequest(
        messages,
        temperature=0.2,
        max_tokens=64,
        stop=["END"],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    server.enqueue(gemini_sse(*gemini_stream(["{}"])))
    await guarded(provider, request)
    body = server.requests[0].json
    assert body["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "What is this?"},
                {
                    "fileData": {
                        "fileUri": "https://example.com/cat.png?x=1",
                        "mimeType": "image/png",
                    }
                },
                {"inlineData": {"mimeType": "image/png", "data": png}},
            ],
        },
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "weather", "args": {"city": "Oslo"}},
                    "thoughtSignature": SKIP_SIGNATURE,  # "gemini-test": not a Gemini 1 or 2
                }
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "weather", "response": {"temp": 3}}}],
        },
    ]
    assert body["tools"] == [
        {
            "functionDeclarations": [
                {"name": "weather", "description": "d", "parametersJsonSchema": schema}
            ]
        }
    ]
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}
    }
    assert body["generationConfig"] == {
        "temperature": 0.2,
        "maxOutputTokens": 64,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        "thinkingConfig": {"includeThoughts": True},
    }


# -- not streamed --------------------------------------------------------------------


async def test_complete_text_usage_and_tool_calls(
    server: SSEServer, provider: GeminiProvider
) -> None:
    """complete() posts :generateContent and reads text (not thoughts), usage and calls."""
    parts = [{"text": "thinking", "thought": True}, {"text": "Hi"}, call_part("f", {"a": 1})]
    server.enqueue(response_json(gemini_response(parts, "STOP", (4, 2, 9))))
    completion = await provider.complete(REQUEST)
    assert server.requests[0].path == "/v1/models/gemini-test:generateContent"
    assert server.requests[0].headers["x-goog-api-key"] == KEY
    assert completion.text == "Hi" and completion.finish_reason == "tool_calls"
    assert completion.usage == Usage(4, 11, 9)
    assert completion.tool_calls == (ToolCall("call_0", "f", '{"a":1}'),)


async def test_complete_errors(server: SSEServer, provider: GeminiProvider) -> None:
    """complete(): a 404 carries Google's message; a SAFETY finish names it."""
    server.enqueue(
        gemini_error(404, "models/nope is not found for API version v1beta"),
        response_json(gemini_response([{"text": "x"}], "SAFETY")),
    )
    with pytest.raises(ProviderError, match="is not found") as caught:
        await provider.complete(REQUEST)
    assert caught.value.status == 404 and not caught.value.retryable
    with pytest.raises(ProviderError, match="finishReason SAFETY"):
        await provider.complete(REQUEST)


# -- configuration and secrets ---------------------------------------------------------


async def test_key_is_required_for_google_and_never_shown(server: SSEServer) -> None:
    """googleapis.com without a key is a ConfigError naming GEMINI_API_KEY; a key (also a
    SecretStr) never shows in the repr or in an error."""
    with pytest.raises(ConfigError, match="GEMINI_API_KEY"):
        GeminiProvider(model="gemini-test")
    made = GeminiProvider(base_url=server.base_url, api_key=SecretStr(KEY), model="gemini-test")
    try:
        assert KEY not in repr(made)
        server.enqueue(gemini_error(401, "API key not valid."))
        with pytest.raises(ProviderError) as caught:
            await guarded(made)
        assert KEY not in str(caught.value)
        assert server.requests[0].headers["x-goog-api-key"] == KEY
    finally:
        await made.aclose()


# -- framing -------------------------------------------------------------------------


def test_crlf_framer_frames_as_sse_framer_does() -> None:
    """Google's \\r\\n\\r\\n events, a comment and a two-line event give the same payloads
    whole, one event per read (the fast path) or split anywhere; a long event is refused."""
    events = [
        b'data: {"a":1}\r\n\r\n',
        b": ping\r\n\r\n",
        b"data: x\r\ndata: y\r\n\r\n",
        b"data: {}\r\n\r\n",
    ]
    stream = b"".join(events)
    expected = SSEFramer(1024).feed(stream)
    assert expected == [b'{"a":1}', b"x\ny", b"{}"]
    per_event = SSEFramer(1024)
    assert [p for event in events for p in per_event.feed(event)] == expected
    for cut in range(1, len(stream)):
        framer = SSEFramer(1024)
        assert framer.feed(stream[:cut]) + framer.feed(stream[cut:]) + framer.close() == expected
    with pytest.raises(EventTooLarge):
        SSEFramer(8).feed(b"data: " + b"x" * 9 + b"\r\n\r\n")


def test_replayed_calls_to_gemini_3_bear_the_stand_in_signature() -> None:
    """Gemini 3 refuses a replayed function call with no thought signature: the first call
    of a model turn bears Google's stand-in; Gemini 2.5 gets none; thoughts can be off."""
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        for i in range(2)
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "one"},
        {"role": "tool", "tool_call_id": "c1", "content": "two"},
    ]
    request = ChatRequest(messages)
    turns = request_body(request, model="gemini-3-pro-preview")["contents"]
    first, second = turns[1]["parts"]
    assert first["thoughtSignature"] == SKIP_SIGNATURE and "thoughtSignature" not in second
    assert turns[2]["parts"][1] == {
        "functionResponse": {"name": "f", "response": {"result": "two"}}
    }
    old = request_body(request, model="gemini-2.5-flash", thoughts=False)
    assert all("thoughtSignature" not in part for part in old["contents"][1]["parts"])
    assert "generationConfig" not in old


async def test_registry_builds_the_gemini_adapter(server: SSEServer) -> None:
    """``create_provider("gemini", …)`` gives this adapter, with the options handed over."""
    made = create_provider(
        "gemini", base_url=server.base_url, api_key=SecretStr(KEY), model="gemini-test"
    )
    try:
        assert isinstance(made, GeminiProvider) and made.model == "gemini-test"
    finally:
        await made.aclose()
