"""Resume instead of re-calling after a takeover, and traceable requests (issue 15 items 6, 9).

A fake resumable provider (an in-memory "server" of responses, shared by both owners) reports
a checkpoint before each delta it yields; the real Runner, keeper and store carry it across a
takeover: owner A streams half the answer and stalls, its renewals have stored the
checkpoint, owner B resumes A's response and commits the whole answer exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease import LeaseStore, LeaseTimings, RetryPolicy, StageBudget
from ai_lease.errors import ProviderError
from ai_lease.job import Job
from ai_lease.lease.base import CHECKPOINT_LIMIT, Acquired, Fence, Renewal
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Checkpoint, Completion, Delta, Usage
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.request_ids import client_request_id
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider, Stall
from tests.harness.sse_server import SSEServer, chat_chunks, json_response, sse

FAST = LeaseTimings(
    ttl=1.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.2,
    stage_budgets={"call_ai": StageBudget(0.5, 20)},
)
PARTS = ["Once", " upon", " a", " time", " there", " was", " one", " answer."]
ANSWER = "".join(PARTS)
HALF = 4


class ResumableFake:
    """An in-memory provider that can resume: each response is a list of parts, event
    ``sequence`` n being part n (from 1). A fresh call creates a response; a call with
    ``resume`` continues that response after its sequence. ``stall_first`` makes the first
    created stream hang after that many parts (a stuck owner)."""

    name = "resumable"

    def __init__(self, stall_first: int | None = None, gone: bool = False) -> None:
        self.stall_first, self.gone = stall_first, gone
        self.creates = 0
        self.resumes: list[tuple[str, int]] = []
        self.request_ids: list[str | None] = []

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.request_ids.append(request.client_request_id)
        stall_after: int | None = None
        if request.resume is None:
            self.creates += 1
            response_id, start = f"resp_{self.creates}", 0
            if self.creates == 1:
                stall_after = self.stall_first
        else:
            response_id, start = request.resume.response_id, request.resume.sequence
            self.resumes.append((response_id, start))
            if self.gone:
                raise ProviderError(f"response {response_id} is gone", retryable=False, status=404)
            yield Delta(text=request.resume.text)  # the text before the checkpoint, first
        for sequence in range(start + 1, len(PARTS) + 1):
            if stall_after is not None and sequence > stall_after:
                await asyncio.Event().wait()
            # real: paces a live model beside a real store's renewals
            await asyncio.sleep(0.08)  # a live model: renewals happen while it streams
            if request.on_checkpoint is not None:  # before the delta, as adapters do
                request.on_checkpoint(Checkpoint(self.name, response_id, sequence))
            yield Delta(text=PARTS[sequence - 1])
        yield Delta(finish_reason="stop")
        yield Delta(usage=Usage(prompt_tokens=1, completion_tokens=len(PARTS) - start))

    async def complete(self, request: ChatRequest) -> Completion:
        raise NotImplementedError("streaming only")

    async def aclose(self) -> None:
        pass


def _runner(store: LeaseStore, provider: object, node: str, **hooks: object) -> Runner:
    return Runner(
        store,
        provider=provider,  # type: ignore[arg-type]
        config=RunConfig(timings=FAST, node_id=node, call_retry=RetryPolicy(attempts=1)),
        hooks=RunHooks(**hooks),  # type: ignore[arg-type]
    )


async def _stalled_owner(store: LeaseStore, provider: object, job: Job) -> asyncio.Task[object]:
    """Owner A runs ``job`` until its stream stalls and the keeper gives the lease up."""
    stalled = asyncio.Event()
    owner = _runner(
        store, provider, "node-a", on_event=lambda e: stalled.set() if e.kind == "stalled" else None
    )
    run = asyncio.create_task(owner.run(job))
    await asyncio.wait_for(stalled.wait(), 10)
    return run


async def _stop(run: asyncio.Task[object]) -> None:
    """Stop owner A (it may have followed B to the result already)."""
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run


async def test_takeover_resumes_the_stream_and_commits_the_whole_answer_once(
    store: LeaseStore,
) -> None:
    """A stalled owner's checkpoint (stored by its renewals) is resumed by the next owner:
    one create, one resume at A's sequence, and the whole answer committed exactly once."""
    fake, job = ResumableFake(stall_first=HALF), Job("resume-me", input="x")
    zombie = await _stalled_owner(store, fake, job)
    record = await store.get(job.key)
    assert record is not None and record.checkpoint is not None
    stored = orjson.loads(record.checkpoint)
    assert stored == {
        "provider": "resumable",
        "response_id": "resp_1",
        "sequence": HALF,
        "text": "".join(PARTS[:HALF]),
    }
    try:
        done = await asyncio.wait_for(_runner(store, fake, "node-b").run(job), 15)
    finally:
        await _stop(zombie)
    assert done.output == ANSWER
    assert fake.creates == 1 and fake.resumes == [("resp_1", HALF)]
    assert done.takeovers == 1 and done.checkpoint is None
    assert (await store.get(job.key)).checkpoint is None  # type: ignore[union-attr]


async def test_takeover_without_a_checkpoint_calls_afresh(store: LeaseStore) -> None:
    """An owner whose provider reports no checkpoints leaves none: the next owner calls
    the model afresh (no resume) and commits its answer."""
    job = Job("no-checkpoint", input="x")
    zombie = await _stalled_owner(store, ScriptedProvider(["x", Stall()]), job)
    record = await store.get(job.key)
    assert record is not None and record.checkpoint is None
    fake = ResumableFake()
    try:
        done = await asyncio.wait_for(_runner(store, fake, "node-b").run(job), 15)
    finally:
        await _stop(zombie)
    assert done.output == ANSWER and fake.creates == 1 and fake.resumes == []


@pytest.mark.parametrize(
    "checkpoint",
    [
        "{not json",
        "[1, 2]",
        '{"provider": "resumable", "response_id": "resp_9", "sequence": "4", "text": ""}',
        '{"provider": "resumable", "response_id": "", "sequence": 4, "text": ""}',
        '{"provider": "resumable", "response_id": "resp_9", "sequence": 4, "text": 7}',
        '{"provider": "another", "response_id": "resp_9", "sequence": 4, "text": "abc"}',
    ],
    ids=["not-json", "not-object", "bad-sequence", "no-id", "bad-text", "other-provider"],
)
async def test_an_unusable_checkpoint_in_the_record_means_a_fresh_call(
    store: LeaseStore, checkpoint: str
) -> None:
    """A malformed checkpoint (or another provider's) is ignored: a fresh call, no crash."""
    key = f"bad-checkpoint-{abs(hash(checkpoint))}"
    won = await store.acquire(key, "dead#1.x", ttl=0.3, max_no_progress=30)
    assert isinstance(won, Acquired)
    renewal = await store.renew(
        won.fence,
        ttl=0.3,
        stage="call_ai",
        progress_version=1,
        max_no_progress=30,
        grace=0.2,
        checkpoint=checkpoint,
    )
    assert renewal.ok and (await store.get(key)).checkpoint == checkpoint  # type: ignore[union-attr]
    await asyncio.sleep(0.5)  # real: the lease lapses on the store's own clock
    fake = ResumableFake()
    done = await asyncio.wait_for(_runner(store, fake, "node-b").run(Job(key, input="x")), 15)
    assert done.output == ANSWER and fake.creates == 1 and fake.resumes == []


async def test_a_response_that_cannot_be_resumed_falls_back_to_a_fresh_call(
    store: LeaseStore,
) -> None:
    """The provider refuses the resume (the response is gone): one fresh call, whose whole
    answer is committed without the checkpoint's text doubled."""
    fake, job = ResumableFake(stall_first=HALF), Job("gone", input="x")
    zombie = await _stalled_owner(store, fake, job)
    fake.gone = True
    try:
        done = await asyncio.wait_for(_runner(store, fake, "node-b").run(job), 15)
    finally:
        await _stop(zombie)
    assert done.output == ANSWER
    assert fake.resumes == [("resp_1", HALF)] and fake.creates == 2
    assert [rid.rsplit(":", 1)[1] for rid in fake.request_ids[-2:]] == ["1", "2"]  # type: ignore[union-attr]


# -- X-Request-Id (item 9) ---------------------------------------------------------------------


async def test_each_request_sends_a_fresh_uuid_and_the_job_correlation(store: LeaseStore) -> None:
    """A real loopback request carries a UUID4 X-Request-Id, fresh on its retry, and
    X-Client-Request-Id <key>:<token>:1, then :2 (issue 24: a non-UUID X-Request-Id is
    refused by llama-cpp-python's server)."""
    async with SSEServer() as server:
        server.enqueue(
            json_response(503, {"error": {"message": "busy"}}),
            sse(*chat_chunks(["Hel", "lo"], usage=(3, 2))),
        )
        provider = OpenAICompatProvider(base_url=server.base_url, model="m", http="httpx")
        runner = Runner(
            store,
            provider=provider,
            config=RunConfig(
                timings=FAST, call_retry=RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
            ),
        )
        try:
            done = await runner.run(Job("trace-me", input="x"))
        finally:
            await provider.aclose()
    assert done.output == "Hello"
    ids = [request.headers.get("x-request-id") for request in server.requests]
    assert len(set(ids)) == 2 and all(uuid.UUID(str(i)).version == 4 for i in ids), ids
    client = [request.headers.get("x-client-request-id") for request in server.requests]
    assert client == [f"trace-me:{done.token}:1", f"trace-me:{done.token}:2"]


def test_client_request_id_is_header_safe() -> None:
    """Control characters, non-ASCII, spaces and '%' are percent-encoded; a long key is
    cut and made unique by a digest; the value stays printable ASCII."""
    assert client_request_id("plain-key/1", 7, 1) == "plain-key/1:7:1"
    assert client_request_id("r\u00e9sum\u00e9 2", 7, 2) == "r%C3%A9sum%C3%A9%202:7:2"
    assert client_request_id("a\r\nX-Evil: 1\x00%", 7, 3) == "a%0D%0AX-Evil:%201%00%25:7:3"
    long_a, long_b = (
        client_request_id("\u00e9" * 512, 1, 1),
        client_request_id("\u00e9" * 511 + "e", 1, 1),
    )
    assert long_a != long_b and len(long_a) < 220 and len(long_b) < 220
    for value in (long_a, long_b):
        head = value.split("~")[0]
        assert all(0x21 <= ord(c) < 0x7F for c in value)
        assert head.count("%") * 3 == len(head)  # whole escapes only: never half of one


# -- the keeper's side: a checkpoint goes out only when it changed -----------------------------


class RecordingStore(SQLiteStore):
    """A real SQLite store that notes the checkpoint each renewal carried."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.sent: list[str | None] = []

    async def renew(self, fence: Fence, **kw: Any) -> Renewal:  # type: ignore[override]
        self.sent.append(kw.get("checkpoint"))
        return await super().renew(fence, **kw)


async def test_keeper_sends_a_checkpoint_only_when_it_changed(tmp_path: Path) -> None:
    """Renewals carry the work's checkpoint when it changed since the last stored one, none
    otherwise; one over the limit is left out and the renewal still goes through."""
    store = RecordingStore(tmp_path / "k.db")
    try:
        won = await store.acquire("job", "A", ttl=30, max_no_progress=30)
        assert isinstance(won, Acquired)
        progress = Progress()
        progress.enter("call_ai", StageBudget(max_no_progress=30))
        current: list[str | None] = [None]
        keeper = LeaseKeeper(
            store,
            won.fence,
            progress,
            FAST,
            valid_until=progress.clock() + 30,
            checkpoint=lambda: current[0],
        )
        for value in (None, "one", "one", "two", "x" * (CHECKPOINT_LIMIT + 1), "two"):
            current[0] = value
            await keeper.tick()
        assert store.sent == [None, "one", None, "two", None, None]
        record = await store.get("job")
        assert record is not None and record.checkpoint == "two"
    finally:
        await store.aclose()
