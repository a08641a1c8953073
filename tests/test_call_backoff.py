"""Calling a contended or refusing server again (issue 24): an interrupted stream backs off,
growing and jittered, within the stage's deadline; ``max_concurrency`` keeps calls from
interrupting each other; a 5xx that says the request itself is invalid is called once more,
never nine times."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease import LeaseTimings, RetryPolicy, StageBudget
from ai_lease.errors import ConfigError, JobFailed, ProviderError, StreamInterrupted
from ai_lease.job import Job, Status
from ai_lease.lease.events import Event
from ai_lease.providers import create_provider
from ai_lease.providers.base import Provider
from ai_lease.providers.concurrency import LimitedProvider, limit_calls
from ai_lease.providers.errors import RequestRefused, status_error
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.retry import INTERRUPTED_CALLS, MODEL_CALL, call_with_retries
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.settings import load_settings
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import StreamTimeouts
from tests.harness.sse_server import (
    Request,
    Response,
    Sleep,
    SSEServer,
    chat_chunks,
    json_response,
    sse,
)

QUICK = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
TIMINGS = LeaseTimings(
    ttl=3.0,
    renew_interval=0.6,
    op_timeout=0.5,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(10, 30)},
)
PATHS: dict[str, Callable[..., Provider]] = {
    "aiohttp": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}
GRAMMAR_500 = {
    "error": {
        "code": 500,
        "message": "JSON schema conversion failed: failed to parse grammar: unknown format",
        "type": "server_error",
    }
}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"format": "??"}}}


# -- a 5xx that says the request is invalid ---------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "refused"),
    [
        (500, "failed to parse grammar: expecting name at ???", True),
        (500, 'response_format type must be one of "text" or "json_object"', True),
        (500, "Invalid quantifier {2,1} in /a{2,1}/", True),  # llama-cpp-python's
        (501, "tool_choice 'required' is not supported", True),
        (500, "CUDA error: out of memory", False),
        (503, "failed to parse grammar", False),  # unavailable: a server's, whatever it says
        (500, "", False),
    ],
)
def test_which_5xx_is_the_requests_fault(status: int, message: str, refused: bool) -> None:
    """Only a 500/501 whose JSON error message names a schema, grammar, response_format,
    tool choice, an invalid request or a parse failure is RequestRefused (not retryable)."""
    body = orjson.dumps({"error": {"message": message, "type": "server_error"}})
    error = status_error("p", status, body if message else b"", {})
    assert isinstance(error, RequestRefused) is refused
    assert error.retryable is not refused and error.status == status


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_schema_the_server_cannot_compile_is_called_twice_not_nine_times(
    tmp_path: Path, path: str
) -> None:
    """llama.cpp's 500 for a json_schema it cannot compile: one more call, then the job is
    FAILED after one attempt (before: 3 call retries x 3 attempts = 9 requests)."""
    async with SSEServer(responder=lambda _: json_response(500, GRAMMAR_500)) as server:
        provider = PATHS[path](base_url=server.base_url, api_key="sk-test", model="m")
        config = RunConfig(timings=TIMINGS, retry=QUICK, call_retry=QUICK)
        async with SQLiteStore(tmp_path / "s.db") as store:
            try:
                with pytest.raises(JobFailed, match="failed to parse grammar"):
                    job = Job("schema", input="x", output="json", response_format=SCHEMA)
                    await Runner(store, provider=provider, config=config).run(job)
            finally:
                await provider.aclose()
            record = await store.get("schema")
    assert len(server.requests) == 2
    assert record is not None and record.status is Status.FAILED and record.attempts == 1


# -- an interrupted stream backs off ----------------------------------------------------------


class Interrupted:
    """A call the server interrupts ``times`` times, then answers."""

    def __init__(self, times: int) -> None:
        self.times, self.calls = times, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.times:
            raise StreamInterrupted("[DONE]", provider="p")
        return "whole"


class FakeTime:
    """A clock that the retry loop's sleeps move forward (no real waiting)."""

    def __init__(self) -> None:
        self.now, self.waits = 100.0, []  # type: ignore[var-annotated]

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


async def test_an_interrupted_stream_backs_off_growing_and_jittered() -> None:
    """Interrupted 6 times: called 7 times, each wait within 0.5-1.0 of a backoff that grows
    0.5, 1, 2, 4, 8 s (capped), not all the same fraction (jitter)."""
    call, time_ = Interrupted(6), FakeTime()
    told: list[tuple[str, float]] = []
    result = await call_with_retries(
        call,
        MODEL_CALL,
        clock=time_.clock,
        sleep=time_.sleep,
        on_retry=lambda exc, wait: told.append((type(exc).__name__, wait)),
    )
    assert result == "whole" and call.calls == 7
    backoffs = [MODEL_CALL.backoff(n) for n in range(1, 7)]
    assert backoffs == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert all(b / 2 <= w <= b for w, b in zip(time_.waits, backoffs, strict=True)), time_.waits
    assert len({round(w / b, 6) for w, b in zip(time_.waits, backoffs, strict=True)}) > 1
    assert told == [("StreamInterrupted", w) for w in time_.waits]


async def test_interruptions_stop_at_the_cap_and_at_the_deadline() -> None:
    """At most INTERRUPTED_CALLS calls; and none whose wait would end past the deadline."""
    endless, time_ = Interrupted(100), FakeTime()
    with pytest.raises(StreamInterrupted):
        await call_with_retries(endless, MODEL_CALL, clock=time_.clock, sleep=time_.sleep)
    assert endless.calls == INTERRUPTED_CALLS == 8
    tight, time_ = Interrupted(100), FakeTime()
    deadline = time_.now + 5.0
    with pytest.raises(StreamInterrupted):
        await call_with_retries(
            tight, MODEL_CALL, deadline_at=deadline, clock=time_.clock, sleep=time_.sleep
        )
    assert time_.now <= deadline and 2 <= tight.calls < INTERRUPTED_CALLS, tight.calls


async def test_other_transient_errors_keep_the_policys_three_calls() -> None:
    """A 503 is still called 3 times in all (the policy's attempts), not 8."""
    calls = 0

    async def busy() -> str:
        nonlocal calls
        calls += 1
        raise ProviderError("HTTP 503", retryable=True, status=503)

    time_ = FakeTime()
    with pytest.raises(ProviderError):
        await call_with_retries(busy, MODEL_CALL, clock=time_.clock, sleep=time_.sleep)
    assert calls == 3


# -- max_concurrency --------------------------------------------------------------------------


def _slow(_: Request) -> Response:
    """An answer whose first token comes 0.8 s after the request."""
    return sse(Sleep(0.8), *chat_chunks(["all ", "of ", "it"]))


async def _three_jobs(tmp_path: Path, provider: Provider, events: list[Event]) -> list[Any]:
    config = RunConfig(
        timings=TIMINGS,
        retry=QUICK,
        call_retry=RetryPolicy(attempts=1),  # an interruption would fail its attempt
        stream_timeouts=StreamTimeouts(first_token=1.5, idle=5, total=20),
    )
    async with SQLiteStore(tmp_path / "s.db") as store:
        runner = Runner(store, provider=provider, config=config, hooks=RunHooks(events.append))
        jobs = [runner.run(Job(f"j{i}", input="x")) for i in range(3)]
        return await asyncio.wait_for(asyncio.gather(*jobs), 60)


@pytest.mark.parametrize("name", ["openai-compatible", "openai"])
async def test_max_concurrency_1_keeps_a_one_slot_server_from_interrupting(
    tmp_path: Path, name: str
) -> None:
    """Three jobs on one llama.cpp-like server (a new request interrupts the running stream)
    with max_concurrency 1: no stream is interrupted, each is whole, and the wait for the
    slot (up to 1.6 s) is not charged to the 1.5 s first-token budget."""
    events: list[Event] = []
    async with SSEServer(responder=_slow, interrupt_on_request=True) as server:
        opts = {"base_url": server.base_url, "model": "m"}
        provider = create_provider(name, max_concurrency=1, **opts)
        assert isinstance(provider, LimitedProvider) and provider.name == name
        try:
            done = await _three_jobs(tmp_path, provider, events)
        finally:
            await provider.aclose()
    assert [d.output for d in done] == ["all of it"] * 3
    assert server.interrupted == 0 and len(server.requests) == 3
    assert not [e for e in events if e.kind in ("stream_timeout", "retry")]


def test_max_concurrency_is_bounded_and_reaches_the_provider() -> None:
    """1..10000 in the settings (else exit 2's ConfigError) and in limit_calls; the CLI's
    options carry it to create_provider, which wraps the provider (model, name kept)."""
    for bad in (0, 10_001, "many"):
        with pytest.raises(ConfigError, match="max_concurrency"):
            load_settings(env={}, provider={"max_concurrency": bad})
    inner = OpenAICompatProvider(base_url="http://127.0.0.1:1/v1", model="m")
    for bad_limit in (0, 10_001, True):
        with pytest.raises(ConfigError, match="max_concurrency"):
            limit_calls(inner, bad_limit)  # type: ignore[arg-type]
    from ai_lease.cli.provider_options import provider_options

    settings = load_settings(env={}, provider={"name": "ollama", "max_concurrency": 4})
    name, opts = provider_options(settings, {}, env={})
    assert opts["max_concurrency"] == 4
    made = create_provider(name, **opts)
    assert isinstance(made, LimitedProvider) and made.limit == 4 and made.model is None
    assert made.base_url == "http://127.0.0.1:11434"


async def test_the_call_cap_is_per_server_whatever_model_a_job_names() -> None:
    """Two calls naming different models against one capped server share its slot: a job's
    model string neither bypasses max_concurrency nor adds a slot of its own."""
    import asyncio

    from ai_lease.providers.base import ChatRequest
    from ai_lease.providers.concurrency import limit_calls
    from ai_lease.testing.scripted import Pause, ScriptedProvider

    inner = ScriptedProvider(["a", Pause(0.2), "b"])
    capped = limit_calls(inner, 1, base_url="http://127.0.0.1:9/v1")
    running = 0
    most = 0

    async def counted(model: str) -> None:
        nonlocal running, most
        stream = capped.stream(ChatRequest([{"role": "user", "content": "x"}], model=model))
        first = True
        async for _ in stream:
            if first:
                running += 1
                most = max(most, running)
                first = False
        running -= 1

    await asyncio.gather(counted("model-a"), counted("model-b"), counted("model-c"))
    assert most == 1, f"{most} calls ran at once against one server capped at 1"
