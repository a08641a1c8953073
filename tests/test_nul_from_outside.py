"""A NUL from outside, end to end on every store (SQLite, Redis, PostgreSQL): a provider's
error message or finish reason holding one through ``ai-lease submit`` (a subprocess against
a loopback HTTP model) and through a worker; a key or key prefix holding one in a dashboard
URL (real uvicorn, httpx)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

from ai_lease.errors import ProviderError
from ai_lease.job import Job, Status
from ai_lease.lease import LeaseStore
from ai_lease.lease.events import Event
from ai_lease.retry import RetryPolicy
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Raise, ScriptedProvider
from tests.harness.sse_server import SSEServer, chat_chunks, json_response, sse
from tests.test_hostile_input import clean_env, run_cli_async
from tests.test_ui_app import serving
from tests.test_ui_states import assert_page
from tests.test_worker_loop import TIMINGS, TTL, run_until

SAID = "bad \\u0000 request"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.toml").write_text(
        'key = "nul-1"\nprompt = "summarize"\ninput = "One. Two. Three."\n'
    )
    return tmp_path


async def _submit(server: SSEServer, workdir: Path, store_url: str) -> tuple[int, str, str]:
    env = clean_env(
        AI_LEASE_STORE__URL=store_url,
        AI_LEASE_PROVIDER__NAME="openai-compatible",
        AI_LEASE_PROVIDER__BASE_URL=server.base_url,
        AI_LEASE_PROVIDER__MODEL="m",
        AI_LEASE_RETRY__ATTEMPTS="1",
    )
    code, _, err = await run_cli_async("submit", "job.toml", "--quiet", cwd=workdir, env=env)
    _, status, _ = await run_cli_async("status", "nul-1", "--json", cwd=workdir, env=env)
    return code, err, status


async def test_a_provider_error_holding_a_nul_fails_the_job_with_its_cause(
    workdir: Path, store_url: str
) -> None:
    """A 400 whose message holds a NUL: exit 1 with one error line, no traceback; the job
    is FAILED at once with the provider's message (NUL escaped), not RUNNING until its TTL."""
    async with SSEServer() as server:
        server.enqueue(json_response(400, {"error": {"message": "bad \u0000 request"}}))
        code, err, status = await _submit(server, workdir, store_url)
    assert code == 1, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ai-lease: error:")
    record = orjson.loads(status)
    assert record["status"] == "FAILED", record
    assert "HTTP 400" in record["last_error"] and SAID in record["last_error"], record


async def test_a_finish_reason_holding_a_nul_commits_the_whole_answer(
    workdir: Path, store_url: str
) -> None:
    """A complete answer whose finish reason holds a NUL: exit 0, DONE, the answer whole;
    the finish reason stored escaped."""
    async with SSEServer() as server:
        server.enqueue(sse(*chat_chunks(["One. ", "Two."], finish_reason="st\u0000op")))
        code, err, status = await _submit(server, workdir, store_url)
    assert code == 0, err
    record = orjson.loads(status)
    assert record["status"] == "DONE", record
    assert record["result"] == "One. Two.", record
    assert record["finish_reason"] == "st\\u0000op"


async def test_under_a_worker_the_job_fails_with_the_real_cause_not_a_lapse(
    store: LeaseStore,
) -> None:
    """A retryable provider error holding a NUL, twice: each attempt hands the job back
    (its release stored), so the job ends FAILED well inside one lease TTL naming the
    provider's message — not "lease lapsed" after a TTL per attempt."""
    error = ProviderError("HTTP 503: bad \x00 request", retryable=True, provider="p")
    runner = Runner(
        store,
        provider=ScriptedProvider([Raise(error)]),
        config=RunConfig(
            timings=TIMINGS,
            retry=RetryPolicy(attempts=2, initial=0.05),
            call_retry=RetryPolicy(attempts=1),
            node_id="w1",
            trace=False,
        ),
    )
    await Runner(store, config=RunConfig(trace=False)).submit(Job("nul-w", input="x"))
    events: list[Event] = []
    worker = Worker(
        store, runner, sweep_interval=0.1, grace=1.0, worker_id="w1", on_event=events.append
    )

    async def failed() -> bool:
        job = await store.get("nul-w")
        return job is not None and job.status is Status.FAILED

    started = time.monotonic()
    await run_until(worker, failed, 3 * TTL)
    # real: a worker on a real store, whose lease lapses on its clock
    assert time.monotonic() - started < TTL, "an attempt waited out its lease"
    job = await store.get("nul-w")
    assert job is not None and job.last_error is not None
    assert "HTTP 503: " + SAID in job.last_error and "lease lapsed" not in job.last_error
    assert not [e for e in events if e.kind == "job_error"], [str(e) for e in events]


BAD_URLS = [
    ("GET", "/jobs?prefix=%00"),
    ("GET", "/jobs?prefix=a%00b&status=RUNNING"),
    ("GET", "/jobs/a%00b"),
    ("POST", "/jobs/a%00b/cancel"),
    ("POST", "/jobs/a%00b/retry"),
    ("POST", "/jobs/a%00b/remove"),
]


async def test_a_key_or_prefix_no_job_can_have_is_a_400_page(store: LeaseStore) -> None:
    """``?prefix=%00``, ``/jobs/a%00b`` and each action on such a key: a 400 page saying
    why, never a 500; the good pages still answer."""
    async with serving(store) as url, httpx.AsyncClient(base_url=url) as client:
        for method, path in BAD_URLS:
            page = assert_page(await client.request(method, path), 400)
            assert "no job" in page, (path, page[-800:])
        for path in ("/live/jobs?prefix=%00", "/live/jobs/a%00b"):
            response = await client.get(path)
            assert response.status_code == 400, (path, response.text[:300])
        # A newline: the route's path pattern does not match it, Starlette's plain 404.
        assert (await client.get("/jobs/a%0Ab")).status_code == 404
        assert_page(await client.get("/jobs?prefix=a"))
        assert_page(await client.get("/jobs/nope"), 404)
