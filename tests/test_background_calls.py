"""Background responses are paid for once per attempt (issue 25 item 5): a call-level retry
resumes the response its failed call left, a response given up is cancelled, and a
cancellation of the work (a stall, a lost lease) leaves the response to whoever resumes it.

The real Runner, keeper and SQLite store, the lean Responses adapter in background mode,
and a loopback Responses server that counts creates (``POST /v1/responses``), resumes
(``GET /v1/responses/{id}?stream=true&starting_after=N``) and cancels
(``POST /v1/responses/{id}/cancel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ai_lease import LeaseTimings, RetryPolicy, StageBudget
from ai_lease.errors import JobFailed
from ai_lease.job import Job, Status
from ai_lease.lease.events import Event
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.run import background
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import StreamTimeouts
from tests.harness.background_responses import BackgroundResponsesServer
from tests.harness.responses_server import text_events

PIECES = ["Thought", " it", " through."]
ANSWER = "".join(PIECES)
TIMINGS = LeaseTimings(
    ttl=2.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(20, 60)},
)
SILENT_FIRST_TOKEN = StreamTimeouts(first_token=0.4, idle=5.0, total=30.0)
QUICK_CALLS = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
QUICK_ATTEMPTS = RetryPolicy(attempts=3, initial=0.05, max_backoff=0.1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(tmp_path / "jobs.db") as opened:
        yield opened


def _runner(
    store: SQLiteStore, provider: OpenAIResponsesProvider, events: list[Event], **config: object
) -> Runner:
    settings: dict[str, object] = {
        "timings": TIMINGS,
        "node_id": "node-a",
        "stream_timeouts": SILENT_FIRST_TOKEN,
        "call_retry": QUICK_CALLS,
        "retry": QUICK_ATTEMPTS,
    }
    return Runner(
        store,
        provider=provider,
        config=RunConfig(**(settings | config)),  # type: ignore[arg-type]
        hooks=RunHooks(on_event=events.append),
    )


def _provider(server: BackgroundResponsesServer) -> OpenAIResponsesProvider:
    return OpenAIResponsesProvider(
        base_url=server.base_url, api_key="sk-test", model="m", background=True
    )


def _creates(server: BackgroundResponsesServer) -> int:
    return sum(1 for r in server.requests if r.method == "POST" and r.path == "/v1/responses")


async def test_a_retry_after_silent_thinking_resumes_the_response(store: SQLiteStore) -> None:
    """The live stream says only response.created / in_progress (the model reasons
    silently) past the first-token budget; the retry resumes that response after its
    last event instead of creating another: one create, one resume, no cancel."""
    events: list[Event] = []
    async with BackgroundResponsesServer() as server:
        server.script(text_events(PIECES), hang_after=2)  # the replay has it all
        provider = _provider(server)
        try:
            done = await asyncio.wait_for(
                _runner(store, provider, events).run(Job("silent", input="x")), 30
            )
        finally:
            await provider.aclose()
        assert done.output == ANSWER
        assert (server.creates, _creates(server), server.resumes) == (1, 1, 1), server.requests
        assert server.cancels == 0
        (get,) = [r for r in server.requests if r.method == "GET"]
        assert urlsplit(get.path).path == "/v1/responses/resp_1"
        assert parse_qs(urlsplit(get.path).query)["starting_after"] == ["1"]
    kinds = [e.kind for e in events]
    assert "call_retry" in kinds and "resumed" in kinds and "response_abandoned" not in kinds


async def test_a_job_whose_model_never_speaks_creates_one_response_per_attempt(
    store: SQLiteStore,
) -> None:
    """The measured case: first-token timeouts on every call, 3 call retries x 3 attempts.
    Creates are bounded by the attempts (3, not 9); each attempt's retries resume its
    response; each response given up is cancelled, and the cancel is in the timeline."""
    events: list[Event] = []
    job = Job("never-speaks", input="x")
    async with BackgroundResponsesServer(silent_after=2) as server:
        for _ in range(9):
            server.script(text_events(PIECES))
        provider = _provider(server)
        try:
            with pytest.raises(JobFailed, match="FirstTokenTimeout"):
                await asyncio.wait_for(_runner(store, provider, events).run(job), 60)
        finally:
            await provider.aclose()
        assert server.creates == 3 == _creates(server), server.requests
        assert set(server.cancelled) == set(server.created_ids()), server.cancelled
        assert server.resumes >= 2 * 3  # two retries per attempt resumed, none re-created
    record = await store.get(job.key)
    assert record is not None and record.status is Status.FAILED
    entries, _ = await store.timeline(job.key)
    notes = [e.detail for e in entries if e.kind == "model_call"]
    cancels = [detail for detail in notes if detail.startswith("cancel")]
    assert {d.split(" · ")[2] for d in cancels} == {f"response {r}" for r in server.created_ids()}
    assert all("cancelled" in d for d in cancels), cancels
    given_up = {d.split(" · ")[2] for d in cancels if "after FirstTokenTimeout" in d}
    assert given_up == {f"response {r}" for r in server.created_ids()}, cancels
    said = [e for e in events if e.kind == "response_abandoned"]
    assert len(said) == len(cancels), (said, cancels)


async def test_a_cancel_is_bounded_and_never_fails_the_job_on_its_own(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider slow to cancel is given up on after the cancel's bound: the job still
    fails with the model's error (not the cancel's), and the note says no answer came."""
    monkeypatch.setattr(background, "CANCEL_WAIT_S", 0.3)
    events: list[Event] = []
    job = Job("slow-cancel", input="x")
    async with BackgroundResponsesServer(silent_after=2, cancel_delay=30) as server:
        server.script(text_events(PIECES))
        provider = _provider(server)
        started = time.monotonic()
        try:
            with pytest.raises(JobFailed, match="FirstTokenTimeout"):
                await asyncio.wait_for(
                    _runner(store, provider, events, retry=RetryPolicy(attempts=1)).run(job), 30
                )
        finally:
            await provider.aclose()
        took = time.monotonic() - started
    # real: a loopback HTTP server and a SQLite store
    assert server.cancelled == ["resp_1"] and took < 15, took
    entries, _ = await store.timeline(job.key)
    (note,) = [e.detail for e in entries if e.detail.startswith("cancel")]
    assert "no answer within" in note, note


async def test_a_stalled_owner_leaves_its_response_to_the_next_owner(store: SQLiteStore) -> None:
    """A cancellation of the work (the keeper steps down on a stall) cancels nothing: the
    next owner resumes the same response from the stored checkpoint and commits it whole."""
    events: list[Event] = []
    stalled = asyncio.Event()
    stalls = LeaseTimings(
        ttl=1.0,
        renew_interval=0.2,
        op_timeout=0.15,
        poll_interval=0.05,
        self_fence_margin=0.2,
        stage_budgets={"call_ai": StageBudget(0.6, 20)},
    )
    patient = StreamTimeouts(first_token=10.0, idle=10.0, total=30.0)
    job = Job("stalls", input="x")
    async with BackgroundResponsesServer() as server:
        server.script(text_events(PIECES), hang_after=2)  # silent past max_no_progress
        a, b = _provider(server), _provider(server)

        def on_event(event: Event) -> None:
            events.append(event)
            if event.kind == "stalled":
                stalled.set()

        owner = Runner(
            store,
            provider=a,
            config=RunConfig(timings=stalls, node_id="node-a", stream_timeouts=patient),
            hooks=RunHooks(on_event=on_event),
        )
        zombie = asyncio.create_task(owner.run(job))
        try:
            await asyncio.wait_for(stalled.wait(), 15)
            follower = Runner(
                store,
                provider=b,
                config=RunConfig(timings=stalls, node_id="node-b", stream_timeouts=patient),
            )
            done = await asyncio.wait_for(follower.run(job), 20)
        finally:
            zombie.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await zombie
            await a.aclose()
            await b.aclose()
        assert done.output == ANSWER
        assert server.creates == 1 and server.resumes == 1 and server.cancels == 0
    assert not [e for e in events if e.kind == "response_abandoned"]
