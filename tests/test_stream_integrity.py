"""A streamed answer is whole or it is an error: every adapter over real loopback HTTP.

Interrupted streams (``[DONE]`` with no finish reason, as llama.cpp's server ends a running
stream when another request arrives), a 200 with no events at all (llama.cpp's answer to a
prompt beyond its context), size limits on one event and on the answer, the first-token
event said while the answer still streams, Retry-After values that are not numbers, and
``base_url`` values no retry can mend.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    JobSpecError,
    ProviderError,
    StreamInterrupted,
    StreamLimitExceeded,
)
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Completion, Provider
from ai_lease.providers.errors import MAX_RETRY_AFTER_S, parse_retry_after
from ai_lease.providers.openai_compat import OpenAICompatProvider, _sse_batches
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.retry import call_with_retries
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.settings import load_settings
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider
from ai_lease.timeouts import RetryPolicy, StreamLimits, StreamTimeouts
from tests.harness.sse_server import (
    Repeat,
    Sleep,
    SSEServer,
    chat_chunks,
    json_response,
    sse,
)

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
RELAXED = StreamTimeouts(first_token=5.0, idle=5.0, total=20.0)
FAST_RETRY = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.05)
ADAPTERS: dict[str, Callable[..., Provider]] = {
    "compat": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "compat-httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}
WHOLE = ["The whole ", "answer, ", "every ", "word."]


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=sorted(ADAPTERS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def provider(kind: str, server: SSEServer) -> AsyncIterator[Provider]:
    """Each adapter, pointed at the loopback server."""
    made = ADAPTERS[kind](base_url=server.base_url, api_key="sk-test", model="m")
    yield made
    await made.aclose()


async def collect(provider: Provider, limits: StreamLimits | None = None) -> Completion:
    return await StreamGuard(RELAXED, Progress(), limits=limits).call(provider, REQUEST)


def retried(provider: Provider, errors: list[BaseException]) -> Any:
    return call_with_retries(
        lambda: collect(provider), FAST_RETRY, on_retry=lambda exc, _: errors.append(exc)
    )


def interrupted(*texts: str) -> Any:
    """llama.cpp's interrupted stream: content, then ``[DONE]`` with no finish chunk."""
    return sse(*chat_chunks(list(texts), finish_reason=None))


# -- 0: [DONE] without a finish reason is never a result ---------------------------------------


async def test_done_without_finish_reason_is_an_interrupted_stream(
    provider: Provider, server: SSEServer
) -> None:
    """[DONE] after half an answer and no finish chunk raises StreamInterrupted, no text."""
    server.enqueue(interrupted("Half ", "an "))
    with pytest.raises(StreamInterrupted) as caught:
        await collect(provider)
    assert caught.value.retryable is True
    assert caught.value.chunks == 2
    assert "interrupted" in str(caught.value)


async def test_done_without_any_content_or_finish_is_interrupted(
    provider: Provider, server: SSEServer
) -> None:
    """A role chunk then [DONE] (the empty answers of the two-worker run) is interrupted too."""
    server.enqueue(interrupted())
    with pytest.raises(StreamInterrupted):
        await collect(provider)


async def test_interrupted_stream_is_called_again_within_the_stage(
    provider: Provider, server: SSEServer
) -> None:
    """An interruption after content is retried by the call retries: the whole answer wins."""
    server.enqueue(interrupted("The whole "), sse(*chat_chunks(WHOLE)))
    errors: list[BaseException] = []
    completion = await retried(provider, errors)
    assert completion.text == "".join(WHOLE)
    assert [type(e) for e in errors] == [StreamInterrupted]
    assert len(server.requests) == 2


async def test_length_finish_is_a_complete_capped_answer(
    provider: Provider, server: SSEServer
) -> None:
    """finish_reason "length" is a real answer (capped by max_tokens), kept with its reason."""
    server.enqueue(sse(*chat_chunks(["Capped ", "answer"], finish_reason="length")))
    completion = await collect(provider)
    assert (completion.text, completion.finish_reason) == ("Capped answer", "length")


async def test_guard_refuses_any_stream_that_ends_without_a_finish_reason() -> None:
    """Whatever the provider, a stream with no finish reason is not returned as an answer."""

    class NoFinish(ScriptedProvider):
        async def stream(self, request: ChatRequest) -> AsyncIterator[Any]:
            async for delta in super().stream(request):
                if delta.finish_reason is None:
                    yield delta

    with pytest.raises(StreamInterrupted):
        await StreamGuard(RELAXED).call(NoFinish(["a", "b"]), REQUEST)


# -- 0b: a 200 with no events is not retried, and says why ------------------------------------


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close-delimited"])
async def test_200_with_no_events_is_final_and_names_the_likely_cause(
    provider: Provider, server: SSEServer, chunked: bool
) -> None:
    """An event stream with no event at all: EmptyEventStream at once, one request only."""
    server.enqueue(*[sse(done=False, chunked=chunked)] * 3)
    errors: list[BaseException] = []
    with pytest.raises(EmptyEventStream) as caught:
        await retried(provider, errors)
    assert caught.value.retryable is False
    assert "200 with no events" in str(caught.value)
    assert "context" in str(caught.value)
    assert (errors, len(server.requests)) == ([], 1)


# -- 0d: the first-token event is said when the first token arrives ----------------------------


async def test_first_token_event_is_said_while_the_answer_still_streams(
    server: SSEServer, tmp_path: Path
) -> None:
    """Paced stream (first token, 0.8 s, the rest): first_token is emitted before the end."""
    first = chat_chunks(["First "], finish_reason=None)
    rest = chat_chunks(["and the rest."])[1:]
    server.enqueue(sse(*first, Sleep(0.8), *rest))
    seen: list[tuple[str, float]] = []

    def sink(event: Event) -> None:
        seen.append((event.kind, time.monotonic()))

    store = SQLiteStore(tmp_path / "ai-lease.db")
    provider = OpenAICompatProvider(base_url=server.base_url, model="m")
    try:
        runner = Runner(
            store,
            provider=provider,
            config=RunConfig(record_history=False),
            hooks=RunHooks(on_event=sink),
        )
        record = await runner.run(Job("paced", input="x", prompt_text="{{ input }}"))
    finally:
        await provider.aclose()
        await store.aclose()
    assert record.output == "First and the rest."
    at = {kind: when for kind, when in reversed(seen)}  # the first of each kind
    assert "first_token" in at, seen
    assert at["model_call"] - at["first_token"] >= 0.6, (
        f"first_token said {at['model_call'] - at['first_token']:.3f}s before the stream's end"
    )


# -- 14: size limits ---------------------------------------------------------------------------


def _limited(kind: str, server: SSEServer, max_event_bytes: int) -> Provider:
    return ADAPTERS[kind](base_url=server.base_url, model="m", max_event_bytes=max_event_bytes)


async def _bounded_call(
    provider: Provider, limits: StreamLimits | None = None
) -> tuple[BaseException | None, float, int]:
    """The error, the seconds it took, and the peak memory traced during the call."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        async with asyncio.timeout(15):
            await collect(provider, limits)
    except Exception as exc:
        error: BaseException | None = exc
    else:
        error = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return error, time.monotonic() - started, peak


async def test_an_endless_line_is_refused_with_bounded_memory(kind: str, server: SSEServer) -> None:
    """An SSE line that never ends: StreamLimitExceeded(max_event_bytes) soon, the buffer never
    much past the limit, the connection closed, and no retry."""
    limit = 256 * 1024
    server.enqueue(sse(b"data: ", Repeat(b"x" * 16384), done=False))
    provider = _limited(kind, server, limit)
    try:
        error, took, peak = await _bounded_call(provider)
    finally:
        await provider.aclose()
    assert isinstance(error, StreamLimitExceeded), repr(error)
    assert (error.limit, error.retryable) == ("max_event_bytes", False)
    # real: a socket to the loopback test server; CPU time bounded
    assert took < 10, f"took {took:.1f}s"
    # The peak counts the in-process server and the HTTP library's read buffers too (uvloop
    # reads 256 KiB at a time): 17x was seen; an unbounded buffer grows without end.
    assert peak < 32 * limit, f"peak {peak} bytes for a {limit}-byte limit"
    await server.wait_connections_open(0)


async def test_an_endless_stream_of_large_events_stops_at_max_answer_bytes(
    provider: Provider, server: SSEServer
) -> None:
    """Large content events forever: StreamLimitExceeded(max_answer_bytes), memory bounded,
    the connection closed."""
    chunk = chat_chunks(["y" * 65536], finish_reason=None)[1]
    server.enqueue(sse(Repeat(b"data: " + orjson.dumps(chunk) + b"\n\n"), done=False))
    limits = StreamLimits(max_answer_bytes=1024 * 1024)
    error, took, peak = await _bounded_call(provider, limits)
    assert isinstance(error, StreamLimitExceeded), repr(error)
    assert (error.limit, error.retryable) == ("max_answer_bytes", False)
    # real: a socket to the loopback test server; CPU time bounded
    assert took < 10, f"took {took:.1f}s"
    assert peak < 24 * limits.max_answer_bytes, f"peak {peak} bytes"
    assert server.bytes_sent < 64 * limits.max_answer_bytes
    await server.wait_connections_open(0)


async def test_a_long_event_in_small_reads_is_parsed_in_linear_time() -> None:
    """16 MiB of one event in 4 KiB reads: the reader does not re-split its buffer per read."""
    piece = b"z" * 4096

    async def reads() -> AsyncIterator[bytes]:
        yield b"data: "
        for _ in range(4096):
            yield piece
        yield b"\n\n"

    started = time.monotonic()
    batches = [batch async for batch in _sse_batches(reads(), 32 * 1024 * 1024)]
    took = time.monotonic() - started
    assert [len(p) for batch in batches for p in batch] == [16 * 1024 * 1024]
    # real: the parser's CPU time is what is bounded
    assert took < 3.0, f"{took:.2f}s for one 16 MiB event"


async def test_events_split_anywhere_still_parse() -> None:
    """Events cut at every byte boundary (CRLF halves included) parse as when sent whole."""
    wire = b"data: a\r\n\r\n: ping\r\n\r\nretry: 5\r\n\r\ndata: b\r\ndata: c\n\ndata: [DONE]\n\n"
    for size in range(1, len(wire) + 1):

        async def reads(size: int = size) -> AsyncIterator[bytes]:
            for i in range(0, len(wire), size):
                yield wire[i : i + size]

        got = [p async for batch in _sse_batches(reads(), 1024) for p in batch]
        assert got == [b"a", b"b\nc", b"[DONE]"], size


def test_stream_limits_come_from_the_settings() -> None:
    """[stream] max_event_bytes / max_answer_bytes reach the value object; bad ones refused."""
    env = {"AI_LEASE_STREAM__MAX_EVENT_BYTES": "4096", "AI_LEASE_STREAM__MAX_ANSWER_BYTES": "9"}
    assert load_settings(env=env).stream_limits() == StreamLimits(4096, 9)
    assert load_settings(env={}).stream_limits() == StreamLimits(1024 * 1024, 8 * 1024 * 1024)
    with pytest.raises(ConfigError, match=r"stream\.max_event_bytes"):
        load_settings(env={"AI_LEASE_STREAM__MAX_EVENT_BYTES": "0"})


# -- 18: Retry-After, base_url, SSE blocks without data ----------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("soon", None),
        ("nan", None),
        ("Mon, 99 Foo 2015", None),
        ("inf", MAX_RETRY_AFTER_S),
        ("1e400", MAX_RETRY_AFTER_S),
        ("86400", MAX_RETRY_AFTER_S),
        ("-5", 0.0),
        ("2", 2.0),
    ],
)
def test_retry_after_is_parsed_or_ignored_and_bounded(value: str, seconds: float | None) -> None:
    """Retry-After: seconds within 0..60; a value that is neither a number nor a date: None."""
    assert parse_retry_after(value) == seconds


async def test_unparsable_retry_after_falls_back_to_the_backoff(
    provider: Provider, server: SSEServer
) -> None:
    """A 429 with Retry-After: soon is retried on the policy's backoff, then succeeds."""
    server.enqueue(
        json_response(429, {"error": {"message": "slow down"}}, {"Retry-After": "soon"}),
        sse(*chat_chunks(WHOLE)),
    )
    errors: list[BaseException] = []
    started = time.monotonic()
    completion = await retried(provider, errors)
    assert completion.text == "".join(WHOLE)
    assert len(errors) == 1 and isinstance(errors[0], ProviderError)
    assert errors[0].status == 429 and errors[0].retry_after is None
    assert time.monotonic() - started < 5  # real: a socket to the loopback test server


@pytest.mark.parametrize("url", ["http://[bad", "http://127.0.0.1:99999/v1", "ftp://host/v1"])
def test_a_bad_base_url_is_a_configuration_error(kind: str, url: str) -> None:
    """A base_url no retry can mend is refused when the provider is built: ConfigError."""
    with pytest.raises(ConfigError, match=r"provider\.base_url"):
        ADAPTERS[kind](base_url=url, model="m", api_key="sk-test")


async def test_an_event_with_only_retry_is_ignored(provider: Provider, server: SSEServer) -> None:
    """An SSE block with no data line (``retry:`` only) is not dispatched, per the SSE spec."""
    events = chat_chunks(WHOLE)
    server.enqueue(sse(b"retry: 3000\n\n", *events[:2], b"id: 7\n\n", *events[2:]))
    errors: list[BaseException] = []
    completion = await retried(provider, errors)
    assert completion.text == "".join(WHOLE)
    assert (errors, len(server.requests)) == ([], 1)


@pytest.mark.parametrize(
    ("temperature", "max_tokens"),
    [(float("nan"), None), (-0.5, None), (2.5, None), (None, 0), (None, -3), (None, 1 << 40)],
)
def test_bad_sampling_values_are_refused_at_the_edge(
    kind: str, temperature: float | None, max_tokens: int | None
) -> None:
    """NaN / negative / out-of-range temperature and max_tokens: a clear error, job and provider."""
    with pytest.raises(ConfigError, match=r"provider\.(temperature|max_tokens)"):
        ADAPTERS[kind](model="m", api_key="k", temperature=temperature, max_tokens=max_tokens)
    with pytest.raises(JobSpecError, match=r"temperature|max_tokens"):
        Job("k", input="x", temperature=temperature, max_tokens=max_tokens)  # type: ignore[arg-type]


async def test_provider_sampling_defaults_reach_the_body_and_a_job_value_wins(
    kind: str, server: SSEServer
) -> None:
    """A provider's temperature/max_tokens fill the body; the request's own values win."""
    made = ADAPTERS[kind](base_url=server.base_url, model="m", temperature=0.25, max_tokens=77)
    server.enqueue(sse(*chat_chunks(["ok"])), sse(*chat_chunks(["ok"])))
    try:
        await StreamGuard(RELAXED).call(made, REQUEST)
        await StreamGuard(RELAXED).call(
            made, ChatRequest(REQUEST.messages, temperature=1.0, max_tokens=5)
        )
    finally:
        await made.aclose()
    bodies = [r.json for r in server.requests]
    assert [(b["temperature"], b["max_tokens"]) for b in bodies] == [(0.25, 77), (1.0, 5)]


# -- 16 / 18 through the CLI: settings and job files reach the request, or exit 2 -------------


def _cli_env(server: SSEServer | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env |= {
        "AI_LEASE_PROVIDER__NAME": "openai-compatible",
        "AI_LEASE_PROVIDER__MODEL": "m",
        "AI_LEASE_PROVIDER__BASE_URL": server.base_url if server else "http://127.0.0.1:9/v1",
    }
    return env | extra


async def _cli(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``ai-lease --store <cwd>/a.db ARGS`` as a subprocess: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "ai_lease", "--store", f"sqlite:///{cwd / 'a.db'}", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _submit(
    cwd: Path, env: dict[str, str], job: str, *, json: bool = False
) -> tuple[int, str, str]:
    (cwd / "job.toml").write_text(job)
    return await _cli(cwd, env, "submit", "job.toml", "--json" if json else "--quiet")


JOB = 'key = "j"\ninput = "x"\nprompt_text = "{{ input }}"\n'


@pytest.mark.parametrize(
    ("env", "job", "expected"),
    [
        ({"AI_LEASE_PROVIDER__TEMPERATURE": "0.3"}, JOB, {"temperature": 0.3}),
        ({"AI_LEASE_PROVIDER__MAX_TOKENS": "42"}, JOB, {"max_tokens": 42}),
        ({}, JOB + "[provider]\ntemperature = 0.7\n", {"temperature": 0.7}),
        ({}, JOB + "[provider]\nmax_tokens = 9\n", {"max_tokens": 9}),
        (
            {"AI_LEASE_PROVIDER__TEMPERATURE": "0.3", "AI_LEASE_PROVIDER__MAX_TOKENS": "42"},
            JOB + "temperature = 1.5\n[provider]\nmax_tokens = 8\n",
            {"temperature": 1.5, "max_tokens": 8},
        ),
    ],
    ids=["env-temperature", "env-max-tokens", "job-temperature", "job-max-tokens", "job-wins"],
)
async def test_provider_sampling_settings_reach_the_request(
    server: SSEServer, tmp_path: Path, env: dict[str, str], job: str, expected: dict[str, Any]
) -> None:
    """[provider] temperature / max_tokens, from the environment or the job file, arrive in
    the request body the server receives (a job's own value wins over the settings')."""
    server.enqueue(sse(*chat_chunks(["ok"])))
    code, out, err = await _submit(tmp_path, _cli_env(server, **env), job)
    assert (code, out.strip()) == (0, "ok"), err
    [request] = server.requests
    assert {name: request.json.get(name) for name in expected} == expected


@pytest.mark.parametrize(
    ("env", "job", "says"),
    [
        ({}, JOB + "[provider]\ntemperature = nan\n", "temperature"),
        ({}, JOB + "temperature = -1\n", "temperature"),
        ({}, JOB + "[provider]\nmax_tokens = 0\n", "max_tokens"),
        ({"AI_LEASE_PROVIDER__TEMPERATURE": "nan"}, JOB, "provider.temperature"),
        ({"AI_LEASE_PROVIDER__BASE_URL": "http://[bad"}, JOB, "provider.base_url"),
        ({"AI_LEASE_PROVIDER__BASE_URL": "http://127.0.0.1:99999/v1"}, JOB, "provider.base_url"),
    ],
    ids=["nan", "negative", "zero-tokens", "env-nan", "bad-ipv6", "bad-port"],
)
async def test_bad_sampling_values_and_base_urls_exit_2(
    tmp_path: Path, env: dict[str, str], job: str, says: str
) -> None:
    """Bad temperature / max_tokens / base_url: exit 2 with one clear line, no traceback."""
    code, _, err = await _submit(tmp_path, _cli_env(None, **env), job)
    assert code == 2, err
    assert says in err and "Traceback" not in err, err


async def test_a_capped_answer_is_stored_and_the_cap_is_shown(
    server: SSEServer, tmp_path: Path
) -> None:
    """finish_reason "length": exit 0 with the answer, a note saying it stopped at max_tokens
    (stderr; "finish_reason" in --json), and the stored record keeps it (`status` shows it)."""
    capped = sse(*chat_chunks(["Capped ", "answer"], finish_reason="length"))
    server.enqueue(capped)
    code, out, err = await _submit(tmp_path, _cli_env(server), JOB)
    assert (code, out.strip()) == (0, "Capped answer"), err
    assert "max_tokens" in err and "finish_reason length" in err, err
    server.enqueue(capped)
    job = JOB.replace('"j"', '"j2"')
    code, out, err = await _submit(tmp_path, _cli_env(server), job, json=True)
    assert code == 0, err
    assert orjson.loads(out)["finish_reason"] == "length"
    for args in (["status", "j2", "--json"], ["status", "j2"]):
        code, out, err = await _cli(tmp_path, _cli_env(server), *args)
        assert code == 0, err
        assert (
            ("finish_reason length" in out)
            if "--json" not in args
            else (orjson.loads(out)["finish_reason"] == "length")
        ), out
