"""Tokens per minute under a limit (``tpm``), and the rate-limit headers of successful answers.

A call under a ``tpm`` limit takes a place in the limit's token window weighing its estimate,
reweighed to the answer's usage once it ends: calls whose answers spend less than the estimate
leave room for the next ones, and a request that could never fit fails its job saying so. An
answer saying the provider's limit is spent (``x-ratelimit-remaining-*: 0``) pauses the limit
for the whole fleet until the reset it gives, before anyone is refused.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ai_lease import RetryPolicy
from ai_lease.errors import JobFailed, ProviderError
from ai_lease.job import Job
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.lease.slots import SlotFence, SlotGrant, SlotState
from ai_lease.providers.base import ChatRequest, Provider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.providers.rate_headers import listening, spent_for
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.slot_tokens import estimate_tokens
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import StreamTimeouts
from tests.harness.limits import limit_timings
from tests.harness.sse_server import (
    Request,
    Response,
    SSEServer,
    chat_chunks,
    completion_json,
    json_response,
    sse,
)

REAL_TIME = "the server's quota reopens in real time and the store judges windows by its own clock"

TIMINGS = limit_timings(ttl=5.0, call_ai_hard=60)
MAX_TOKENS, PROMPT, ANSWER = 100, 10, 20  # each answer's usage: 30 tokens of a 114 estimate


def _config(limit: CallLimit, **kw: Any) -> RunConfig:
    values: dict[str, Any] = {
        "timings": TIMINGS,
        "retry": RetryPolicy(attempts=1),
        "call_retry": RetryPolicy(attempts=1),
        "stream_timeouts": StreamTimeouts(first_token=5, idle=5, total=30),
        "limits": CallLimits((limit,)),
    }
    return RunConfig(**(values | kw))


# -- what a request weighs, what a header says ---------------------------------------------


def test_a_request_is_estimated_from_its_text_images_tools_and_max_tokens() -> None:
    parts = [{"type": "text", "text": "y" * 8}, {"type": "image_url", "image_url": {"url": "u"}}]
    request = ChatRequest(
        [{"role": "system", "content": "x" * 41}, {"role": "user", "content": parts}],
        max_tokens=50,
        tools=[{"type": "function", "function": {"name": "f"}}],
    )
    tools = len(b'[{"type":"function","function":{"name":"f"}}]')
    assert estimate_tokens(request) == -(-(41 + 8 + tools) // 4) + 2 * 4 + 85 + 50
    assert estimate_tokens(ChatRequest([{"role": "user", "content": ""}]), 7) == 4 + 7
    assert estimate_tokens(None) == 1  # nothing known: the usage corrects it


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20ms"}, 0.02),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m30s"}, 60.0),
        (
            {
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "3.5s",
            },
            3.5,
        ),
        ({"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "2s"}, None),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"}, None),
        ({"x-ratelimit-remaining-requests": "0"}, None),
        ({"anthropic-ratelimit-requests-remaining": "0"}, None),
        ({"retry-after": "3"}, None),  # a success's Retry-After asks nothing
    ],
)
def test_spent_limits_are_read_from_openais_headers(
    headers: dict[str, str], seconds: float | None
) -> None:
    assert spent_for(headers) == seconds


def test_anthropic_resets_are_times() -> None:
    now = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    spent = {
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:04Z",
        "anthropic-ratelimit-requests-remaining": "12",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:09Z",
    }
    assert spent_for(spent, now=now) == 4.0
    past = {**spent, "anthropic-ratelimit-output-tokens-reset": "2025-12-31T23:59:00Z"}
    assert spent_for(past, now=now) == 0.0
    naive = {**spent, "anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:04"}
    assert spent_for(naive, now=now) is None  # no zone: not a time it can be sure of


PATHS: dict[str, Callable[[str], Provider]] = {
    "aiohttp": functools.partial(OpenAICompatProvider, model="m", http="aiohttp"),
    "httpx": functools.partial(OpenAICompatProvider, model="m", http="httpx"),
    "sdk": functools.partial(OpenAISDKProvider, model="m", api_key="sk-test"),
}
HEADERS = {"x-ratelimit-remaining-requests": "7", "x-ratelimit-reset-requests": "2s"}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_every_http_path_lets_the_call_hear_its_answers_headers(
    path: str, stream: bool
) -> None:
    """A success's headers reach the call's listener, streamed or not, on each HTTP path;
    an error's do not (its retry hint goes with the error); outside the block nobody hears."""
    answer = (
        sse(*chat_chunks(["o", "k"]), headers=HEADERS)
        if stream
        else json_response(200, completion_json("ok"), HEADERS)
    )
    heard: list[dict[str, str]] = []
    async with SSEServer() as server:
        for reply in (answer, json_response(429, {"error": {"message": "later"}}, HEADERS)):
            server.enqueue(reply)
        server.enqueue(json_response(200, completion_json("ok"), HEADERS))
        provider = PATHS[path](base_url=server.base_url)
        request = ChatRequest([{"role": "user", "content": "hi"}])
        try:
            with listening(lambda h: heard.append({k.lower(): v for k, v in h.items()})):
                if stream:
                    assert "".join([d.text async for d in provider.stream(request)]) == "ok"
                else:
                    assert (await provider.complete(request)).text == "ok"
                with pytest.raises(ProviderError) as refused:
                    await provider.complete(request)
                assert refused.value.status == 429
            assert (await provider.complete(request)).text == "ok"  # outside: unheard
        finally:
            await provider.aclose()
    assert len(heard) == 1
    assert heard[0]["x-ratelimit-remaining-requests"] == "7"


# -- tokens per minute in a run -------------------------------------------------------------


class Metered:
    """Answers ``ANSWER`` tokens for a ``PROMPT``-token prompt (usage sent, or not), counting
    the tokens it was asked to spend."""

    def __init__(self, usage: bool = True) -> None:
        self.usage, self.requests = usage, 0

    def __call__(self, request: Request) -> Response:
        self.requests += 1
        usage = (PROMPT, ANSWER) if self.usage else None
        return sse(*chat_chunks(["w"] * ANSWER, usage=usage))


async def _run_jobs(
    store: Any, limit: CallLimit, count: int, metered: Metered
) -> tuple[list[Any], list[Event]]:
    events: list[Event] = []
    async with SSEServer(responder=metered) as server:
        provider = OpenAICompatProvider(base_url=server.base_url, model="m")
        config = _config(limit)
        runner = Runner(store, provider=provider, config=config, hooks=RunHooks(events.append))
        jobs = [
            runner.run(Job(f"t{i}", input="x" * 8, max_tokens=MAX_TOKENS)) for i in range(count)
        ]
        try:
            done = await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 60)
        finally:
            await provider.aclose()
    return done, events


async def test_the_answers_usage_frees_the_tokens_it_did_not_spend(slot_store: Any) -> None:
    """tpm 600, each request estimated at over 100 tokens, each answer spending 30: 12 jobs
    all finish well within the minute, as each place is reweighed to its 30 once its answer
    ends; the window holds their usage and never more than the tpm."""
    limit = CallLimit("openai-compatible:m", tpm=600, max_wait=20)
    metered = Metered()
    started = time.monotonic()
    done, events = await _run_jobs(slot_store, limit, 12, metered)
    assert [d.output for d in done] == ["w" * ANSWER] * 12, done
    assert time.monotonic() - started < 30, "no job waited for the window to lapse"
    state = await slot_store.slot_state("openai-compatible:m~tpm")
    assert state == SlotState("openai-compatible:m~tpm", 12 * (PROMPT + ANSWER), 0)
    taken = [e for e in events if e.kind == "slot_taken"]
    assert len(taken) == 12 and {e.attrs["window"] for e in taken} == {"tpm"}
    waited = [e for e in events if e.kind == "slot_wait"]
    assert waited, "the estimates filled the window: some calls waited for a reweigh"
    assert "(tpm 600, " in waited[0].detail


async def test_without_usage_the_estimate_holds_the_window(slot_store: Any) -> None:
    """A server that sends no usage: each place keeps its estimate (over ``MAX_TOKENS``), so
    only as many requests as whole estimates fit in 600 are sent in the minute; the other
    jobs wait out their max_wait, saying so."""
    limit = CallLimit("openai-compatible:m", tpm=600, max_wait=1.5)
    metered = Metered(usage=False)
    done, _ = await _run_jobs(slot_store, limit, 6, metered)
    in_use = (await slot_store.slot_state("openai-compatible:m~tpm")).in_use
    estimate = in_use // metered.requests
    assert in_use == metered.requests * estimate and MAX_TOKENS < estimate <= 200, in_use
    assert metered.requests == 600 // estimate, (metered.requests, estimate)
    failed = [d for d in done if isinstance(d, JobFailed)]
    assert len(failed) == 6 - metered.requests, done
    assert all("no slot of 'openai-compatible:m~tpm' came free" in str(f) for f in failed)


async def test_a_request_larger_than_the_tpm_fails_saying_so(slot_store: Any) -> None:
    """An estimate over the tpm could never be sent: the job fails at once, naming both."""
    limit = CallLimit("openai-compatible:m", tpm=50, max_wait=30)
    metered = Metered()
    started = time.monotonic()
    done, _ = await _run_jobs(slot_store, limit, 1, metered)
    assert isinstance(done[0], JobFailed) and metered.requests == 0
    assert "over the tpm 50 of limit 'openai-compatible:m'" in str(done[0])
    assert time.monotonic() - started < 10


# -- a spent limit said by a success -------------------------------------------------------

QUOTA, CLOSED_S, JOBS, RUNNERS = 3, 1.5, 9, 3


class Quota:
    """``QUOTA`` answers per window; the one that spends the last says so (remaining 0 and
    the reset, as OpenAI does); while closed, a 429 without any retry hint."""

    def __init__(self) -> None:
        self.used, self.opens_at, self.refused, self.answered = 0, 0.0, 0, 0

    def __call__(self, request: Request) -> Response:
        now = time.monotonic()
        if now < self.opens_at:
            self.refused += 1
            return json_response(429, {"error": {"message": "spent", "type": "requests"}})
        if self.used == QUOTA:  # reopened
            self.used = 0
        self.used += 1
        self.answered += 1
        headers = {"x-ratelimit-remaining-requests": str(QUOTA - self.used)}
        if self.used == QUOTA:
            self.opens_at = now + CLOSED_S
            headers["x-ratelimit-reset-requests"] = f"{CLOSED_S}s"
        return sse(*chat_chunks(["fine"]), headers=headers)


async def test_a_spent_limit_in_a_successs_headers_pauses_the_fleet(slot_store: Any) -> None:
    """Three runners, one call at a time: the answer that spends the quota pauses the limit
    until the reset, so no call is sent into the closed window (the 429s come without a hint:
    without the pause every call after the third would be refused and retried blind)."""
    events: list[Event] = []
    quota = Quota()
    async with SSEServer(responder=quota) as server:
        limit = CallLimit(server.base_url, 1, max_wait=30)
        config = _config(limit, call_retry=RetryPolicy(attempts=6, initial=0.05, max_backoff=1))
        providers = [
            OpenAICompatProvider(base_url=server.base_url, model="m") for _ in range(RUNNERS)
        ]
        hooks = RunHooks(events.append)
        runners = [Runner(slot_store, provider=p, config=config, hooks=hooks) for p in providers]
        try:
            jobs = [runners[i % RUNNERS].run(Job(f"q{i}", input="x")) for i in range(JOBS)]
            done = await asyncio.wait_for(asyncio.gather(*jobs), 120)
        finally:
            for p in providers:
                await p.aclose()
    assert [d.output for d in done] == ["fine"] * JOBS
    assert quota.refused == 0, f"{quota.refused} calls were sent into the closed window"
    spent = [e for e in events if e.kind == "rate_spent"]
    assert len(spent) == JOBS // QUOTA
    assert all(0 < float(e.attrs["paused"]) <= CLOSED_S for e in spent)
    waits = [e for e in events if e.kind == "slot_wait" and "by the provider" in e.detail]
    assert waits, "a call held back by the pause says so"


async def test_an_sqlite_file_from_before_weights_keeps_its_slots(tmp_path: Path) -> None:
    """A file whose slots table has no weight column gains it on open: a slot held before
    counts one unit, and weighted places work beside it."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE ai_lease_slots (limit_name TEXT NOT NULL, owner_id TEXT NOT NULL,"
        " token INTEGER NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (limit_name, owner_id))"
    )
    conn.execute("INSERT INTO ai_lease_slots VALUES ('w', 'old', 7, ?)", (time.time() + 60,))
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        assert await store.renew_slot(SlotFence("w", "old", 7), 60)
        big = await store.acquire_slot("w", "big", capacity=100, ttl=60, weight=99)
        assert isinstance(big, SlotGrant)
        assert await store.slot_state("w") == SlotState("w", 100, 0)
    finally:
        await store.aclose()
