"""The ``openai-responses`` adapter against a stateful loopback Responses API server, under
the stream guard: text, usage, progress and liveness, end markers, errors, tool calls, the
request it sends, and background responses checkpointed and resumed after a cut."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from ai_lease.errors import (
    ConfigError,
    FirstTokenTimeout,
    ProviderError,
    StreamIdleTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers import create_provider
from ai_lease.providers.base import ChatRequest, Checkpoint, Completion, ToolCall, Usage
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.providers.responses_events import ResponseNotResumable, ResponsesParser
from ai_lease.retry import MODEL_CALL, call_with_retries
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts
from tests.harness.responses_server import (
    ResponsesServer,
    error_event,
    failed_event,
    function_call_events,
    incomplete_events,
    text_events,
)
from tests.harness.sse_server import json_response

RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"  # a UUID4, as X-Request-Id carries it
REQUEST = ChatRequest(
    [{"role": "user", "content": "hi"}], request_id=RID, client_request_id="job-1:7:1"
)
RELAXED = StreamTimeouts(first_token=5.0, idle=5.0, total=10.0)
TIGHT = StreamTimeouts(first_token=0.4, idle=0.3, total=10.0)
ANSWER = ["The ", "whole ", "answer, ", "exactly ", "once."]


@pytest.fixture
async def server() -> AsyncIterator[ResponsesServer]:
    async with ResponsesServer() as running:
        yield running


@pytest.fixture(params=["aiohttp", "httpx"])
async def provider(
    request: pytest.FixtureRequest, server: ResponsesServer
) -> AsyncIterator[OpenAIResponsesProvider]:
    made = OpenAIResponsesProvider(
        base_url=server.base_url, api_key="sk-test", model="m", http=request.param
    )
    yield made
    await made.aclose()


@pytest.fixture(params=["aiohttp", "httpx"])
async def background(
    request: pytest.FixtureRequest, server: ResponsesServer
) -> AsyncIterator[OpenAIResponsesProvider]:
    made = OpenAIResponsesProvider(
        base_url=server.base_url, api_key="sk-test", model="m", background=True, http=request.param
    )
    yield made
    await made.aclose()


async def guarded(
    provider: OpenAIResponsesProvider,
    request: ChatRequest = REQUEST,
    limits: StreamTimeouts = RELAXED,
) -> tuple[StreamGuard, Completion]:
    guard = StreamGuard(limits, Progress())
    return guard, await guard.call(provider, request)


# -- the happy path ----------------------------------------------------------------------


async def test_text_and_usage(server: ResponsesServer, provider: OpenAIResponsesProvider) -> None:
    """Text deltas are the answer, in order; usage (with reasoning tokens) from completed."""
    server.script(text_events(["Hel", "lo", " world"], usage=(3, 9, 4)))
    _, completion = await guarded(provider)
    assert completion.text == "Hello world"
    assert completion.finish_reason == "stop"
    assert completion.usage == Usage(3, 9, 4)
    assert completion.chunks == 3


async def test_request_body_and_headers(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """System → instructions, parts → input_text / input_image, tool history → items,
    flattened tools, tool_choice, text.format, max_output_tokens, X-Request-Id, the key."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    function = {"name": "weather", "description": "d", "parameters": schema}
    request = ChatRequest(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "https://x/img.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        max_tokens=50,
        temperature=0.2,
        tools=[{"type": "function", "function": function}],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}},
        request_id=RID,
        client_request_id="job-1:7:1",
    )
    server.script(text_events(["{}"]))
    await guarded(provider, request)
    sent = server.requests[0]
    assert sent.headers["x-request-id"] == RID
    assert sent.headers["x-client-request-id"] == "job-1:7:1"
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.json
    assert body["instructions"] == "Be brief."
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://x/img.png", "detail": "auto"},
            ],
        },
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    assert body["tools"] == [{"type": "function", **function}]
    assert body["tool_choice"] == {"type": "function", "name": "weather"}
    assert body["text"] == {"format": {"type": "json_schema", "name": "out", "schema": schema}}
    assert (body["max_output_tokens"], body["temperature"], body["stream"]) == (50, 0.2, True)
    assert "background" not in body and "store" not in body


def test_stop_sequences_and_background_without_store_are_refused() -> None:
    """The Responses API has no stop sequences; background needs store: both say so."""
    with pytest.raises(ConfigError, match="no stop sequences"):
        OpenAIResponsesProvider(api_key="k", model="m").stream_request(
            ChatRequest([{"role": "user", "content": "x"}], stop=["\n"])
        )
    with pytest.raises(ConfigError, match="store"):
        OpenAIResponsesProvider(api_key="k", model="m", background=True, store=False)


async def test_function_call_assembled(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """Argument fragments paced past the first-token budget are progress; the call is whole, with
    the id and name of its output_item.added, and the finish is tool_calls."""
    pieces = ['{"ci', 'ty"', ": ", '"Pa', "ri", 's"', "}"]  # 0.24 s to the first, 0.8 s in all
    server.script(function_call_events("weather", pieces), every=0.08)
    guard, completion = await guarded(provider, limits=TIGHT)
    assert completion.finish_reason == "tool_calls"
    assert completion.tool_calls == (ToolCall("call_1", "weather", '{"city": "Paris"}'),)
    assert completion.text == "" and guard.first_visible_s is None


async def test_reasoning_summary_longer_than_idle_is_progress(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """0.6 s of reasoning summary before any text, against a 0.4 s first-token and 0.3 s
    idle budget, completes; the reasoning is not text."""
    thoughts = [f"step {i}. " for i in range(7)]
    server.script(text_events(["Paris"], reasoning=thoughts), every=0.06)
    guard, completion = await guarded(provider, limits=TIGHT)
    assert completion.text == "Paris"
    assert guard.first_token_s is not None and guard.first_visible_s is not None
    assert guard.first_visible_s - guard.first_token_s >= 0.4


def test_parser_without_sequence_numbers_and_on_a_bad_event() -> None:
    """A server that numbers no events still streams; a bad event stops the stream with a
    malformed-event error, keeping the text before it and not counting the bad event."""
    parser = ResponsesParser("openai-responses")
    texts = [b'{"type":"response.output_text.delta","delta":"a"}'] * 2
    assert [d.text for d in parser.deltas(texts)] == ["a", "a"]
    numbered = b'{"type":"response.output_text.delta","delta":"b","sequence_number":4}'
    out = parser.deltas([numbered, b'{"type":"response.output_text.delta","delta":7}'])
    assert [d.text for d in out] == ["b"] and parser.stopped and parser.sequence == 4
    with pytest.raises(ProviderError, match="malformed event") as caught:
        parser.end()
    assert caught.value.partial


def test_a_resumed_response_failing_after_new_text_is_an_error_not_a_fresh_call() -> None:
    """Resuming, response.failed before any new delta means "call again"; after new text it
    is an ordinary partial failure (calling again would double the answer)."""
    failed = orjson.dumps({**failed_event(), "sequence_number": 9})
    text = b'{"type":"response.output_text.delta","delta":"x","sequence_number":8}'
    fresh = ResponsesParser("openai-responses", response_id="resp_1", after=7)
    assert fresh.deltas([failed]) == [] and isinstance(fresh.error, ResponseNotResumable)
    late = ResponsesParser("openai-responses", response_id="resp_1", after=7, resumed_text=True)
    assert [d.text for d in late.deltas([text, failed])] == ["x"]
    assert late.error is not None and not isinstance(late.error, ResponseNotResumable)
    assert late.error.partial


# -- liveness and timeouts -------------------------------------------------------------


async def test_in_progress_only_is_a_first_token_timeout(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """created / in_progress / item and part events are liveness: the first-token budget
    fires, and the upstream connection is closed."""
    events = text_events(["never"])
    server.script(events, every=0.1, hang_after=4)  # up to content_part.added
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider, limits=TIGHT)
    await server.wait_connections_open(0)


async def test_mid_stream_stall_is_an_idle_timeout(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """Text, then silence: the idle budget fires with the text so far; the connection closes."""
    server.script(text_events(ANSWER), hang_after=6)
    started = time.monotonic()
    with pytest.raises(StreamIdleTimeout) as caught:
        await guarded(provider, limits=TIGHT)
    assert caught.value.text == "The whole "
    assert time.monotonic() - started < 5  # real: a socket to the loopback test server
    await server.wait_connections_open(0)


# -- end markers and errors ------------------------------------------------------------


async def test_end_before_completed_is_an_error(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """A body that ends cleanly before response.completed is a partial error, not a short
    answer; a connection cut mid-answer too."""
    server.script(text_events(ANSWER, end="none"))
    with pytest.raises(ProviderError, match=r"ended before response\.completed") as caught:
        await guarded(provider)
    assert caught.value.partial and caught.value.retryable
    server.script(text_events(ANSWER), cut_after=6)
    with pytest.raises(ProviderError) as cut:
        await guarded(provider)
    assert cut.value.partial


async def test_incomplete_max_output_tokens_is_length(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """response.incomplete for max_output_tokens is a whole but capped answer."""
    server.script(incomplete_events(["Hel", "lo"]))
    _, completion = await guarded(provider)
    assert (completion.text, completion.finish_reason) == ("Hello", "length")


async def test_incomplete_content_filter_fails_without_retry(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """response.incomplete for the content filter fails, naming it, not retryable."""
    server.script(incomplete_events(["Hel"], reason="content_filter"))
    with pytest.raises(ProviderError, match="content filter") as caught:
        await guarded(provider)
    assert not caught.value.retryable


@pytest.mark.parametrize("event", [failed_event(), error_event()], ids=["failed", "error"])
@pytest.mark.parametrize("after_text", [False, True], ids=["before", "after"])
async def test_failure_events(
    server: ResponsesServer,
    provider: OpenAIResponsesProvider,
    event: dict[str, Any],
    after_text: bool,
) -> None:
    """response.failed / error: retryable before visible text, partial after; the message
    names the provider's error."""
    head = text_events(["Hel"], end="none")[: 5 if after_text else 2]
    server.script([*head, event])
    with pytest.raises(ProviderError) as caught:
        await guarded(provider)
    assert caught.value.retryable and caught.value.partial is after_text
    assert "server_error" in str(caught.value)


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_client_errors_fail_at_once(
    server: ResponsesServer, provider: OpenAIResponsesProvider, status: int
) -> None:
    """4xx answers fail without a retry and carry the provider's message."""
    server.enqueue(json_response(status, {"error": {"message": f"nope {status}"}}))
    with pytest.raises(ProviderError, match=f"nope {status}") as caught:
        await call_with_retries(lambda: guarded(provider), MODEL_CALL)
    assert not caught.value.retryable and caught.value.status == status
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_transient_statuses_are_retryable(
    server: ResponsesServer, provider: OpenAIResponsesProvider, status: int
) -> None:
    """429 and 5xx are retryable errors."""
    server.enqueue(json_response(status, {"error": {"message": "busy"}}))
    with pytest.raises(ProviderError) as caught:
        await guarded(provider)
    assert caught.value.retryable and not caught.value.partial


async def test_429_then_success_under_model_call_retries(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """A 429 (Retry-After 0) is retried by call_with_retries, and the answer comes."""
    server.enqueue(json_response(429, {"error": {"message": "slow"}}, {"Retry-After": "0"}))
    server.script(text_events(["ok"]))
    _, completion = await call_with_retries(lambda: guarded(provider), MODEL_CALL)
    assert completion.text == "ok"
    assert len(server.requests) == 2


# -- background: checkpoints and resume ---------------------------------------------------


async def test_background_checkpoints_increase(
    server: ResponsesServer, background: OpenAIResponsesProvider
) -> None:
    """A background stream reports checkpoints of its response id, sequence numbers rising;
    the body asks for background and store."""
    seen: list[Checkpoint] = []
    server.script(text_events(ANSWER), every=0.02)
    request = ChatRequest(REQUEST.messages, on_checkpoint=seen.append)
    _, completion = await guarded(background, request)
    assert completion.text == "".join(ANSWER)
    assert server.requests[0].json["background"] is True
    assert server.requests[0].json["store"] is True
    assert len(seen) >= len(ANSWER)
    assert {c.response_id for c in seen} == {"resp_1"} and {c.text for c in seen} == {""}
    sequences = [c.sequence for c in seen]
    assert sequences == sorted(set(sequences))


async def cut_stream(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> tuple[Checkpoint, str]:
    """A background stream cut mid-answer: its last checkpoint, with the text up to it."""
    seen: list[Checkpoint] = []
    server.script(text_events(ANSWER), every=0.02, cut_after=7)
    guard = StreamGuard(RELAXED)
    with pytest.raises(ProviderError):
        await guard.call(provider, ChatRequest(REQUEST.messages, on_checkpoint=seen.append))
    text = "".join(guard.text_parts)
    assert 0 < len(text) < len("".join(ANSWER))
    last = seen[-1]
    return Checkpoint(last.provider, last.response_id, last.sequence, text), text


async def test_resume_after_a_cut_is_one_create_and_the_whole_answer(
    server: ResponsesServer, background: OpenAIResponsesProvider
) -> None:
    """Resuming from the checkpoint replays the rest: one create in total, and the text is
    the whole answer exactly once."""
    checkpoint, _ = await cut_stream(server, background)
    resumed = ChatRequest(REQUEST.messages, resume=checkpoint)
    _, completion = await guarded(background, resumed)
    assert completion.text == "".join(ANSWER)
    assert completion.usage == Usage(3, 2)
    assert (server.creates, server.resumes) == (1, 1)
    assert server.requests[-1].path.endswith(f"starting_after={checkpoint.sequence}")
    assert server.requests[-1].method == "GET"


async def test_resume_skips_events_replayed_twice(
    server: ResponsesServer, background: OpenAIResponsesProvider
) -> None:
    """A server that replays from the start despite starting_after: the events up to the
    checkpoint are skipped, so the text is still the whole answer once."""
    checkpoint, _ = await cut_stream(server, background)
    server.ignore_starting_after = True
    _, completion = await guarded(background, ChatRequest(REQUEST.messages, resume=checkpoint))
    assert completion.text == "".join(ANSWER)
    assert server.creates == 1


async def test_resumed_stream_reports_checkpoints_from_where_it_resumed(
    server: ResponsesServer, background: OpenAIResponsesProvider
) -> None:
    """The resumed stream goes on reporting checkpoints of the same response, past the old."""
    checkpoint, _ = await cut_stream(server, background)
    seen: list[Checkpoint] = []
    request = ChatRequest(REQUEST.messages, resume=checkpoint, on_checkpoint=seen.append)
    await guarded(background, request)
    assert seen and {c.response_id for c in seen} == {checkpoint.response_id}
    assert min(c.sequence for c in seen) > checkpoint.sequence


@pytest.mark.parametrize("how", ["gone", "failed"])
async def test_resume_of_a_lost_response_calls_again_once(
    server: ResponsesServer,
    background: OpenAIResponsesProvider,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A response that is gone (404) or failed is called again, once: the text is the fresh
    answer, not doubled, and the log says so."""
    checkpoint, _ = await cut_stream(server, background)
    getattr(server, how).add(checkpoint.response_id)
    server.script(text_events(ANSWER))
    with caplog.at_level(logging.WARNING, "ai_lease.providers.openai_responses"):
        _, completion = await guarded(background, ChatRequest(REQUEST.messages, resume=checkpoint))
    assert completion.text == "".join(ANSWER)
    assert server.creates == 2
    assert "not resumed" in caplog.text


async def test_resume_is_ignored_without_background(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """A provider not in background mode never resumes: it sends the request."""
    server.script(text_events(["fresh"]))
    old = Checkpoint("openai-responses", "resp_9", 5, "stale ")
    _, completion = await guarded(provider, ChatRequest(REQUEST.messages, resume=old))
    assert completion.text == "fresh" and server.creates == 1


# -- not streamed, and the registry -------------------------------------------------------


async def test_complete_not_streamed(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """complete() posts without stream and reads the output items and usage."""
    server.script(text_events(["Hel", "lo"], usage=(4, 2)))
    completion = await provider.complete(REQUEST)
    assert (completion.text, completion.finish_reason) == ("Hello", "stop")
    assert completion.usage == Usage(4, 2)
    assert "stream" not in server.requests[0].json
    server.script(function_call_events("weather", ['{"a": 1}']))
    called = await provider.complete(REQUEST)
    assert called.tool_calls == (ToolCall("call_1", "weather", '{"a": 1}'),)
    assert called.finish_reason == "tool_calls"


async def test_complete_capped_or_failed(
    server: ResponsesServer, provider: OpenAIResponsesProvider
) -> None:
    """Not streamed: an incomplete (max_output_tokens) response is "length"; a failed one
    is a retryable error naming the provider's code."""
    server.script(incomplete_events(["Hel"]))
    capped = await provider.complete(REQUEST)
    assert (capped.text, capped.finish_reason) == ("Hel", "length")
    server.script([*text_events([], end="none")[:2], failed_event("server_error")])
    with pytest.raises(ProviderError, match="response failed: server_error") as caught:
        await provider.complete(REQUEST)
    assert caught.value.retryable


async def test_registry_builds_it_and_repr_hides_the_key() -> None:
    """``openai-responses`` is a built-in by name; its repr never shows the key."""
    made = create_provider("openai-responses", api_key="sk-SECRET", model="m")
    try:
        assert isinstance(made, OpenAIResponsesProvider)
        assert "sk-SECRET" not in repr(made)
    finally:
        await made.aclose()
        await asyncio.sleep(0)
