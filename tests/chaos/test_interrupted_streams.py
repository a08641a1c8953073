"""Worker processes against a server that interrupts streams, as llama.cpp's server does.

llama.cpp's server (``interrupt_requests = true``, its default) ends a running stream with
``data: [DONE]`` and no finish chunk when another request arrives. Found against a real
one: with two workers and 20 jobs, 18 were stored DONE with an empty result and the rest
truncated. Here several worker processes stream from one loopback server in that mode; every
job must end DONE with its whole answer or FAILED saying the stream was interrupted — never
DONE with a short or empty answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ai_lease import LeaseStore
from ai_lease.job import Job, JobState, Status
from ai_lease.run.runner import Runner
from tests.harness.sse_server import Request, Response, SSEServer, drip, sse
from tests.harness.worker_proc import Workers

pytestmark = pytest.mark.chaos

JOBS, WORKERS, CONCURRENCY = 12, 3, 2


def answer_for(key: str) -> str:
    return f"The whole answer for {key}, every word of it, to the very end."


def respond(request: Request) -> Response:
    """The answer for the job named in the prompt, a few characters every 20 ms."""
    key = str(request.json["messages"][-1]["content"])
    return sse(*drip(answer_for(key), every=0.02, chunk_size=8))


@pytest.fixture
async def interrupting() -> AsyncIterator[SSEServer]:
    async with SSEServer(responder=respond, interrupt_on_request=True) as server:
        yield server


async def test_interrupted_streams_are_never_stored_as_answers(
    store_url: str, store: LeaseStore, tmp_path: Path, interrupting: SSEServer
) -> None:
    """Streams cut by [DONE] without a finish reason: no job ends DONE with a short answer."""
    extra = ("--base-url", interrupting.base_url, "--mnp", "5")
    keys = [f"interrupted-{i:02d}" for i in range(JOBS)]
    async with Workers(store_url, tmp_path) as workers:
        await asyncio.gather(
            *(
                workers.start_ready(f"W{i}", concurrency=CONCURRENCY, extra=extra)
                for i in range(WORKERS)
            )
        )
        runner = Runner(store)
        for key in keys:
            await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))
        records = await wait_all_terminal(store, keys, workers, timeout=90)

    assert interrupting.interrupted > 0, "the server interrupted no stream: nothing was tested"
    done = {k: r for k, r in records.items() if r.status is Status.DONE}
    short = {k: r.output for k, r in done.items() if r.output != answer_for(k)}
    assert not short, f"stored DONE with a short answer: {short}"
    for key, record in records.items():
        if record.status is Status.FAILED:
            assert "interrupted" in (record.last_error or ""), (key, record.last_error)
    assert done, "no job finished: the retries never got a whole answer through"


async def wait_all_terminal(
    store: LeaseStore, keys: list[str], workers: Workers, timeout: float
) -> dict[str, JobState]:
    """Every key's record once all are DONE or FAILED; the histories on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        records = {key: await store.get(key) for key in keys}
        finished = {k: r for k, r in records.items() if r is not None and r.status.terminal}
        if len(finished) == len(keys):
            return finished
        if time.monotonic() > deadline:
            left = sorted(set(keys) - set(finished))
            raise AssertionError(f"not finished after {timeout:g}s: {left}\n{workers.dump()}")
        await asyncio.sleep(0.2)
