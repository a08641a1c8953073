"""Upstream faults through a real SSE server: the model's stream stalls, drips, breaks or lies.

Scenario 3 runs the owner and the follower as processes on both stores: the owner's stream
sends one content chunk, then only ``: ping`` comments (bytes flow, the job does not move).
Scenario 9 runs a Runner in this process against every kind of broken stream, on SQLite
(the store is not what these test), and checks the stored result is always the whole
answer of a good stream, never a partial one, and that no task, file descriptor or
upstream connection is left behind. Stream budgets: first token 2 s, idle 2 s, total 8 s;
timeouts must fire within ±10 % (or ±100 ms).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ai_lease import LeaseStore, LeaseTimings, StageBudget, StreamTimeouts, open_store
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.timeouts import RetryPolicy
from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, report
from tests.harness.history import of_kind
from tests.harness.sse_server import (
    Cut,
    Hang,
    Reset,
    Response,
    Sleep,
    SSEServer,
    chat_chunks,
    drip,
    json_response,
    raw,
    sse,
)

pytestmark = pytest.mark.chaos

TTL, POLL, IDLE, FIRST, TOTAL = (
    PROFILE[k] for k in ("ttl", "poll", "idle", "first_token", "total")
)
SLACK = 0.5
GOOD = ["The whole ", "answer, ", "every ", "word."]
GOOD_TEXT = "".join(GOOD)
KEY = "upstream-job"


def tolerance(budget: float) -> float:
    """How far a timeout may fire from its budget: ±10 % or ±100 ms, whichever is larger."""
    return max(0.1 * budget, 0.1)


def pings(every: float, count: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(count):
        out += [Sleep(every), b": ping\n\n"]
    return out


def good() -> Response:
    return sse(*chat_chunks(GOOD, usage=(5, 4)))


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


# -- scenario 3: keep-alive comments only, across processes ------------------------------------


async def test_keepalive_pings_do_not_keep_a_stream_alive(
    cluster: ChaosCluster, server: SSEServer
) -> None:
    """One content chunk then only `: ping` every 0.2 s: the idle timeout fires at 2 s, the
    owner steps down, the follower's attempt gets a good stream; one result, DONE once."""
    first = chat_chunks(["partial "], finish_reason=None)
    server.enqueue(sse(*first[:2], *pings(0.2, 40), Hang()), good())
    b = await cluster.start_ready("B", [KEY], sse_url=server.base_url)
    a = await cluster.start("A", [KEY], sse_url=server.base_url)
    await a.wait_for_event("acquired", "A to own the job")
    cluster.go()
    assert await a.exited() == 0, a.dump()
    assert await b.exited() == 0, b.dump()
    histories = cluster.histories()
    verdict = await check_job(cluster.store_url, KEY, histories, ttl=TTL)
    assert verdict.record.output == GOOD_TEXT, "a partial answer was stored"
    assert verdict.committer["node"] == "B"
    assert verdict.total_calls == 2 and len(server.requests) == 2
    a_events = histories["A"]
    chunk = of_kind(a_events, "chunk")[0]
    timeout = of_kind(a_events, "stream_timeout")[0]
    assert timeout["detail"] == "StreamIdleTimeout", timeout
    idle = timeout["at"] - chunk["at"]
    assert abs(idle - IDLE) <= tolerance(IDLE), f"idle timeout after {idle:.3f}s"
    assert not of_kind(a_events, "renew_skipped", "stalled"), "pings counted as a stall"
    released = of_kind(a_events, "released")[0]
    taken = of_kind(histories["B"], "acquired")[0]
    handover = taken["at"] - released["at"]
    assert handover <= POLL + SLACK, f"B took over {handover:.2f}s after A released"
    report("sse pings only", cluster.store_url, idle_timeout_after=idle, takeover_after=handover)


# -- scenario 9: every kind of broken stream, in this process ---------------------------------


class Watched:
    """The provider, with the monotonic time of each call and of each content delta."""

    name = "watched"

    def __init__(self, inner: OpenAICompatProvider) -> None:
        self.inner = inner
        self.calls: list[float] = []
        self.chunks: list[float] = []

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.calls.append(time.monotonic())
        deltas = self.inner.stream(request)
        try:
            async for delta in deltas:
                if delta.text:
                    self.chunks.append(time.monotonic())
                yield delta
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]

    async def complete(self, request: ChatRequest) -> Completion:
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# name: (responses before the good one, the stream timeout expected, model calls)
CASES: dict[str, tuple[list[Response], str | None, int]] = {
    "stall before first token": ([sse(*chat_chunks([])[:1], Hang())], "FirstTokenTimeout", 2),
    "pings before first token": (
        [sse(*chat_chunks([])[:1], *pings(0.2, 30), Hang())],
        "FirstTokenTimeout",
        2,
    ),
    "stall mid-stream": (
        [sse(*chat_chunks(["The whole "], None)[:2], Hang())],
        "StreamIdleTimeout",
        2,
    ),
    "token every 1.8 s": (
        [sse(*drip("The whole answer", every=1.8, chunk_size=2), Hang())],
        "StreamTotalTimeout",
        2,
    ),
    "cut mid-stream": ([sse(*chat_chunks(["The whole "], None)[:2], Cut())], None, 2),
    "reset mid-stream": ([sse(*chat_chunks(["The whole "], None)[:2], Reset())], None, 2),
    "cut without chunked framing": (
        [sse(*chat_chunks(["The whole "], None)[:2], done=False, chunked=False)],
        None,
        2,
    ),
    "malformed chunk": (
        [sse(*chat_chunks(["The whole "], None)[:2], b"data: {not json\n\n")],
        None,
        2,
    ),
    "html page with 200": ([raw(200, b"<html>Gateway login</html>")], None, 2),
    "429 burst": (
        [json_response(429, {"error": {"message": "slow down"}}, {"Retry-After": "0.2"})] * 2,
        None,
        3,
    ),
    "5xx burst past the call retries": (
        [json_response(503, {"error": {"message": "overloaded"}})] * 3,
        None,
        4,
    ),
}
BUDGETS = {"FirstTokenTimeout": FIRST, "StreamIdleTimeout": IDLE, "StreamTotalTimeout": TOTAL}

Timed = list[tuple[float, Event]]


async def run_in_process(
    store: LeaseStore, server: SSEServer, key: str
) -> tuple[Any, Watched, Timed, float]:
    budgets = dict(LeaseTimings().stage_budgets)
    budgets["call_ai"] = StageBudget(PROFILE["mnp"], 60.0)
    timings = LeaseTimings(
        ttl=TTL,
        renew_interval=PROFILE["renew"],
        op_timeout=PROFILE["op_timeout"],
        poll_interval=POLL,
        self_fence_margin=TTL / 4,
        stage_budgets=budgets,
    )
    provider = Watched(OpenAICompatProvider(base_url=server.base_url, model="m", api_key="sk-x"))
    events: Timed = []
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(
            timings=timings,
            stream_timeouts=StreamTimeouts(first_token=FIRST, idle=IDLE, total=TOTAL),
            retry=RetryPolicy(attempts=5, initial=1.0),
            record_history=False,
            trace=False,
        ),
        hooks=RunHooks(on_event=lambda event: events.append((time.monotonic(), event))),
    )
    started = time.monotonic()
    try:
        async with asyncio.timeout(60):
            record = await runner.run(Job(key, input=key, prompt_text="{{ input }}"))
    finally:
        open_upstream = server.connections_open
        await provider.aclose()
    assert open_upstream <= 1, f"{open_upstream} upstream connections left open"
    return record, provider, events, time.monotonic() - started


def fired_after(kind: str, at: float, provider: Watched) -> float:
    """Seconds from what the timeout counts from (request, or last content) to ``at``."""
    if kind == "StreamIdleTimeout":
        return at - max(t for t in provider.chunks if t <= at)
    return at - max(t for t in provider.calls if t <= at)


@pytest.mark.parametrize("case", list(CASES))
async def test_broken_stream_never_stores_a_partial_result(
    case: str, server: SSEServer, sqlite_url: str
) -> None:
    """A broken upstream stream is retried (call or attempt) until a good one; the stored
    result is the whole good answer; the timeout fired on time; nothing leaks."""
    faults, timeout_kind, calls = CASES[case]
    server.enqueue(*faults, good())
    store = open_store(sqlite_url, op_timeout=PROFILE["op_timeout"])
    try:
        await store.get("warm-up")  # the store's connection and thread are not a leak
        fds, tasks = fd_count(), asyncio.all_tasks()
        record, provider, events, took = await run_in_process(store, server, KEY)
        await server.wait_connections_open(0)
        for _ in range(3):  # async generators closed by the loop's finalizer hook (see docs)
            await asyncio.sleep(0)
        assert fd_count() == fds, "file descriptors leaked"
        assert asyncio.all_tasks() == tasks, f"tasks leaked: {asyncio.all_tasks() - tasks}"
    finally:
        await store.aclose()
    assert record.output == GOOD_TEXT, f"stored {record.output!r}, not the whole answer"
    assert len(provider.calls) == calls == len(server.requests), provider.calls
    kinds = [event.kind for _, event in events]
    assert kinds.count("committed") == 1, kinds
    fired = [(at, event) for at, event in events if event.kind == "stream_timeout"]
    assert [event.detail for _, event in fired] == ([timeout_kind] if timeout_kind else [])
    measured: dict[str, float] = {"job_took": took}
    if timeout_kind is not None:
        late = fired_after(timeout_kind, fired[0][0], provider)
        budget = BUDGETS[timeout_kind]
        assert abs(late - budget) <= tolerance(budget), f"{timeout_kind} after {late:.3f}s"
        measured["fired_after"] = late
    report(f"upstream {case}", sqlite_url, **measured)
