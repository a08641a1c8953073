"""What counts as progress in a stream: reasoning and tool-call fragments too, keep-alives not.

Both OpenAI-format adapters (lean on aiohttp and httpx, SDK) against the loopback SSE
server, under the stream guard.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ai_lease.errors import FirstTokenTimeout, StreamIdleTimeout, StreamLimitExceeded
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider, ToolCall
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamLimits, StreamTimeouts
from tests.harness.sse_server import Event, Hang, Sleep, SSEServer, sse

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
ADAPTERS: dict[str, Callable[..., Provider]] = {
    "compat": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "compat-httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}
# idle is shorter than the thinking below: only reasoning keeps such a stream alive
TIGHT = StreamTimeouts(first_token=0.4, idle=0.3, total=10.0)


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=sorted(ADAPTERS))
async def provider(request: pytest.FixtureRequest, server: SSEServer) -> AsyncIterator[Provider]:
    made = ADAPTERS[request.param](base_url=server.base_url, api_key="sk-test", model="m")
    yield made
    await made.aclose()


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice."""
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def thinking(pieces: int, every: float, field: str = "reasoning_content") -> list[Event]:
    """A role chunk, then ``pieces`` reasoning fragments ``every`` seconds apart."""
    events: list[Event] = [chunk({"role": "assistant", "content": ""})]
    for i in range(pieces):
        events += [Sleep(every), chunk({"content": None, field: f"step {i}. "})]
    return events


async def guarded(
    provider: Provider, limits: StreamTimeouts = TIGHT
) -> tuple[StreamGuard, Completion]:
    """The guard after one guarded streamed call, and the call's completion."""
    guard = StreamGuard(limits, Progress())
    return guard, await guard.call(provider, REQUEST)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_longer_than_idle_then_text_completes(
    server: SSEServer, provider: Provider, field: str
) -> None:
    """0.8 s of thinking against a 0.3 s idle and 0.4 s first-token budget: not timed out;
    the answer is the visible text only, and the first visible token is told apart."""
    answer = [chunk({"content": "Paris"}), chunk({}, "stop")]
    server.enqueue(sse(*thinking(8, 0.1, field), Sleep(0.1), *answer))
    guard, completion = await guarded(provider)
    assert completion.text == "Paris"
    assert completion.finish_reason == "stop"
    assert completion.chunks == 1
    assert guard.first_token_s is not None and guard.first_visible_s is not None
    assert guard.first_visible_s - guard.first_token_s >= 0.7


async def test_reasoning_then_stall_is_an_idle_timeout(
    server: SSEServer, provider: Provider
) -> None:
    """Thinking past the first-token budget, then silence: the idle budget fires, counted
    from the last reasoning fragment (not a first-token timeout: tokens did come)."""
    server.enqueue(sse(*thinking(6, 0.1), Hang()))
    with pytest.raises(StreamIdleTimeout) as caught:
        await guarded(provider)
    assert caught.value.text == ""  # reasoning is never answer text


async def test_keep_alives_only_is_still_a_first_token_timeout(
    server: SSEServer, provider: Provider
) -> None:
    """Pings, role-only chunks, empty reasoning and a tool call's name without arguments are
    liveness, not progress. (A guard against counting too much: passes on the old code.)"""
    keep_alive: list[Event] = [chunk({"role": "assistant", "content": ""})]
    for _ in range(8):
        keep_alive += [Sleep(0.1), b": ping\n\n", chunk({"content": "", "reasoning_content": ""})]
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    keep_alive += [chunk({"tool_calls": [call]}), Hang()]
    server.enqueue(sse(*keep_alive))
    with pytest.raises(FirstTokenTimeout):
        await guarded(provider)


async def test_tool_call_fragments_are_progress_and_assembled(
    server: SSEServer, provider: Provider
) -> None:
    """Arguments streamed in pieces for longer than the idle budget count as progress; the
    completion carries the whole call, and ``tool_calls`` is a whole answer."""
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather"}}
    events: list[Event] = [chunk({"role": "assistant", "content": None, "tool_calls": [head]})]
    for piece in ['{"ci', 'ty": ', '"Par', 'is"}', ""]:
        frag = {"index": 0, "function": {"arguments": piece}}
        events += [Sleep(0.12), chunk({"tool_calls": [frag]})]
    server.enqueue(sse(*events, chunk({}, "tool_calls")))
    guard, completion = await guarded(provider)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == ""
    assert completion.tool_calls == (ToolCall("call_1", "weather", '{"city": "Paris"}'),)
    assert guard.first_visible_s is None


async def test_reasoning_bytes_count_against_max_answer_bytes() -> None:
    """Reasoning is not kept, but it is bounded: its bytes count with the text's."""

    async def endless_thought() -> AsyncIterator[Delta]:
        while True:
            yield Delta(reasoning="x" * 1000)

    guard = StreamGuard(TIGHT, limits=StreamLimits(max_answer_bytes=10_000))
    with pytest.raises(StreamLimitExceeded) as caught:
        await guard.collect(endless_thought())
    assert caught.value.limit == "max_answer_bytes"
    assert guard.text_parts == []
