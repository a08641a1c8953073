"""Whole answers, paid for once (issue 25), on every streaming adapter over real loopback HTTP.

* a reasoning model that spends its whole budget thinking (reasoning deltas, then the
  format's length-type finish, no text, no reasoning count in the usage) fails at once,
  saying the budget went on reasoning: one model call, one attempt;
* a finish that arrives and then a body held open (a buffering proxy) is a whole answer
  kept after a short grace, not a stream idle timeout;
* the stored text is exactly the model's, leading and trailing whitespace included.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease.errors import JobFailed
from ai_lease.job import Job, Status
from ai_lease.lease.base import LeaseStore
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import Provider
from ai_lease.providers.gemini import GeminiProvider
from ai_lease.providers.ollama import OllamaProvider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.timeouts import RetryPolicy, StreamTimeouts
from tests.harness.anthropic_server import (
    message_end,
    message_start,
    messages_sse,
    text_block,
    thinking_block,
)
from tests.harness.gemini_server import gemini_event, gemini_response, gemini_sse
from tests.harness.ollama_server import done_line, line, ndjson
from tests.harness.responses_server import event_bytes, response_object, text_events
from tests.harness.sse_server import Event, Hang, Response, Sleep, SSEServer, sse

KEY = "sk-test"
# Retries allowed (quick ones): "one call, one attempt" then says the failure was final.
QUICK = RetryPolicy(attempts=3, initial=0.05, max_backoff=0.05)


def _root(url: str) -> str:
    return url.removesuffix("/v1")


ADAPTERS: dict[str, Callable[[SSEServer], Provider]] = {
    "openai-aiohttp": lambda s: OpenAICompatProvider(
        base_url=s.base_url, api_key=KEY, model="m", http="aiohttp"
    ),
    "openai-httpx": lambda s: OpenAICompatProvider(
        base_url=s.base_url, api_key=KEY, model="m", http="httpx"
    ),
    "openai-sdk": lambda s: OpenAISDKProvider(base_url=s.base_url, api_key=KEY, model="m"),
    "openai-responses": lambda s: OpenAIResponsesProvider(
        base_url=s.base_url, api_key=KEY, model="m"
    ),
    "anthropic": lambda s: AnthropicProvider(base_url=_root(s.base_url), api_key=KEY, model="m"),
    "gemini": lambda s: GeminiProvider(
        base_url=_root(s.base_url) + "/v1beta", api_key=KEY, model="m"
    ),
    "ollama": lambda s: OllamaProvider(base_url=_root(s.base_url), model="m"),
}
OPENAI_CHAT = ("openai-aiohttp", "openai-httpx", "openai-sdk")


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def _chat(*events: Event, done: bool = True) -> Response:
    return sse(*events, done=done)


def _responses(events: list[dict[str, Any]], tail: tuple[Event, ...] = ()) -> Response:
    return sse(*(event_bytes(e) for e in events), *tail, done=False)


# -- the answers, per wire format ----------------------------------------------------------


def reasoning_then_cap(name: str) -> Response:
    """Reasoning only, then the format's length-type finish; no reasoning count anywhere."""
    if name in OPENAI_CHAT:
        return _chat(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": None, "reasoning_content": "thinking hard. "}),
            chunk({}, "length"),
        )
    if name == "openai-responses":
        head = text_events([], reasoning=["thinking hard. "], end="none")[:5]
        final = response_object(
            "incomplete", [], (5, 16), incomplete_details={"reason": "max_output_tokens"}
        )
        return _responses([*head, {"type": "response.incomplete", "response": final}])
    if name == "anthropic":
        return messages_sse(
            message_start(), *thinking_block(0, ["thinking hard. "]), *message_end("max_tokens", 16)
        )
    if name == "gemini":
        thought = gemini_response([{"text": "thinking hard. ", "thought": True}])
        return gemini_sse(gemini_event(thought), gemini_event(gemini_response([], "MAX_TOKENS")))
    assert name == "ollama"
    return ndjson(line(thinking="thinking hard. "), done_line("length", (5, 16)))


def finish_then_held(name: str, text: str = "Paris") -> Response:
    """``text`` and the format's finish, then the body held open (nothing more is sent)."""
    if name in OPENAI_CHAT:
        return _chat(chunk({"content": text}), chunk({}, "stop"), Hang(), done=False)
    if name == "openai-responses":
        return _responses(text_events([text]), (Hang(),))
    if name == "anthropic":
        delta = message_end("end_turn")[0]  # message_delta: the stop reason, no message_stop
        return messages_sse(message_start(), *text_block(0, [text]), delta, Hang())
    if name == "gemini":
        last = gemini_response([{"text": text}], "STOP", usage=(3, 1, 0))
        return gemini_sse(gemini_event(last), Hang())
    assert name == "ollama"
    return ndjson(line(text), done_line("stop"), Hang())


def whole(name: str, text: str) -> Response:
    """A whole answer of ``text`` in one piece, ended as the format ends it."""
    if name in OPENAI_CHAT:
        return _chat(chunk({"content": text}), chunk({}, "stop"))
    if name == "openai-responses":
        return _responses(text_events([text]))
    if name == "anthropic":
        return messages_sse(message_start(), *text_block(0, [text]), *message_end())
    if name == "gemini":
        return gemini_sse(gemini_event(gemini_response([{"text": text}], "STOP", (3, 1, 0))))
    assert name == "ollama"
    return ndjson(line(text), done_line("stop"))


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[LeaseStore]:
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store
    await store.aclose()


async def _run(
    store: LeaseStore,
    name: str,
    answer: Response,
    job: Job,
    timeouts: StreamTimeouts | None = None,
    *,
    let_go: bool = False,
) -> tuple[Any, SSEServer]:
    """Run ``job`` against a loopback server answering ``answer``: (record or JobFailed,
    server); with ``let_go``, the client must have closed its connection too."""
    config = RunConfig(
        retry=QUICK, call_retry=QUICK, stream_timeouts=timeouts or StreamTimeouts(), node_id="n1"
    )
    async with SSEServer() as server:
        server.enqueue(answer)
        provider = ADAPTERS[name](server)
        try:
            try:
                outcome: Any = await Runner(store, provider=provider, config=config).run(job)
            except JobFailed as exc:
                outcome = exc
            if let_go:
                await server.wait_connections_open(0)
        finally:
            await provider.aclose()
    return outcome, server


# -- item 1: a budget spent on reasoning ------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_reasoning_that_spends_the_budget_fails_once_saying_so(
    sqlite: LeaseStore, name: str
) -> None:
    """Reasoning deltas, then a length-type finish and no text (no reasoning count in the
    usage): FAILED, "spent max_tokens=16 on reasoning … raise max_tokens", one call."""
    job = Job(f"r-{name}", input="x.", max_tokens=16)
    outcome, server = await _run(sqlite, name, reasoning_then_cap(name), job)
    assert isinstance(outcome, JobFailed), outcome
    record = await sqlite.get(job.key)
    assert record is not None and record.status is Status.FAILED and record.result is None
    why = record.last_error or ""
    assert "spent max_tokens=16 on reasoning" in why and "raise max_tokens" in why, why
    assert record.attempts == 1 and len(server.requests) == 1


@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_a_whitespace_only_answer_is_empty(sqlite: LeaseStore, name: str) -> None:
    """An answer of only spaces is no answer: FAILED as empty, not stored, one call."""
    job = Job(f"w-{name}", input="x.")
    outcome, server = await _run(sqlite, name, whole(name, "  \n "), job)
    assert isinstance(outcome, JobFailed), outcome
    record = await sqlite.get(job.key)
    assert record is not None and record.status is Status.FAILED
    assert "empty" in (record.last_error or "") and len(server.requests) == 1


# -- item 2: a finish, then a body held open ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_a_finish_then_a_held_body_is_a_whole_answer(sqlite: LeaseStore, name: str) -> None:
    """The finish came, then nothing (no [DONE], no message_stop, no body end): after the
    finish grace the answer is kept (DONE, one call), long before the idle budget, and the
    held connection is let go."""
    timeouts = StreamTimeouts(first_token=10, idle=3.0, total=30, finish_grace=0.2)
    job = Job(f"h-{name}", input="x.")
    started = time.monotonic()
    record, server = await _run(sqlite, name, finish_then_held(name), job, timeouts, let_go=True)
    elapsed = time.monotonic() - started
    assert not isinstance(record, JobFailed), record
    assert record.status is Status.DONE and record.output == "Paris"
    assert len(server.requests) == 1
    # real: a loopback HTTP server and a SQLite store
    assert elapsed < 2.5, elapsed  # the grace, not the 3 s idle budget


@pytest.mark.parametrize("name", OPENAI_CHAT)
async def test_usage_within_the_grace_is_kept(sqlite: LeaseStore, name: str) -> None:
    """The usage chunk that follows the finish within the grace still counts: the grace
    waits for it, it does not cut the stream at the finish."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3}
    answer = _chat(
        chunk({"content": "Paris"}),
        chunk({}, "stop"),
        Sleep(0.1),
        {**chunk({}), "choices": [], "usage": usage},
    )
    timeouts = StreamTimeouts(first_token=10, idle=3.0, total=30, finish_grace=1.0)
    record, _ = await _run(sqlite, name, answer, Job(f"u-{name}", input="x."), timeouts)
    assert record.status is Status.DONE and record.output == "Paris"
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)


# -- item 3: the text exactly as sent -----------------------------------------------------------

EXACT = "  The answer, indented,\nends in a newline and a space.\n "


@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_the_stored_text_is_exactly_the_models(sqlite: LeaseStore, name: str) -> None:
    """Leading and trailing whitespace survive: the stored result is the model's text."""
    record, _ = await _run(sqlite, name, whole(name, EXACT), Job(f"x-{name}", input="x."))
    assert not isinstance(record, JobFailed), record
    assert record.output == EXACT
    again = await sqlite.get(record.key)
    assert again is not None and again.output == EXACT
    assert orjson.loads(again.result or "null") == EXACT


async def test_every_store_keeps_the_text_exactly(store: LeaseStore) -> None:
    """SQLite, Redis and PostgreSQL each give back the very text the model sent."""
    record, _ = await _run(
        store, "openai-aiohttp", whole("openai-aiohttp", EXACT), Job("s", input="x.")
    )
    assert not isinstance(record, JobFailed), record
    again = await store.get("s")
    assert again is not None and again.output == EXACT


async def test_a_whitespace_only_answer_allowed_empty_is_stored_as_sent(sqlite: LeaseStore) -> None:
    """allow_empty = true: a blank answer is a result, and it is stored exactly."""
    job = Job("b", input="x.", allow_empty=True)
    record, _ = await _run(sqlite, "openai-httpx", whole("openai-httpx", " \n"), job)
    assert not isinstance(record, JobFailed), record
    assert record.status is Status.DONE and record.output == " \n"


async def test_the_reason_names_the_providers_cap_when_the_job_sets_none(
    sqlite: LeaseStore,
) -> None:
    """max_tokens set on the provider, not the job: the reason still names max_tokens=12."""
    async with SSEServer() as server:
        server.enqueue(reasoning_then_cap("openai-httpx"))
        provider = OpenAICompatProvider(base_url=server.base_url, api_key=KEY, max_tokens=12)
        config = RunConfig(retry=QUICK, call_retry=QUICK, node_id="n1")
        try:
            with pytest.raises(JobFailed, match=r"spent max_tokens=12 on reasoning"):
                await Runner(sqlite, provider=provider, config=config).run(
                    Job("p", input="x.", model="m")
                )
        finally:
            await provider.aclose()
