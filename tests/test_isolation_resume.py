"""Resume under process isolation: a worker whose job streams in a child process is
SIGKILLed mid-stream; a second process worker takes the job over and its child resumes the
same background response (openai-responses) instead of calling the model again.

Two real ``ai-lease worker`` processes (isolation from ``AI_LEASE_WORKER__ISOLATION``), a
real SQLite store and the loopback Responses server: one create request, one resume, the
whole answer committed once; the killed worker's children die with it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ai_lease import Status
from ai_lease.job import Job
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.responses_server import ResponsesServer, text_events
from tests.test_isolation import descendants, gone
from tests.test_resume_takeover import ANSWER, PIECES, _checkpointed
from tests.test_resume_takeover import _env as responses_env

REAL_TIME = "the stream runs in a child process, which is killed"


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc"),
]
KEY = "resume-iso"


async def _worker(workdir: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "ai_lease", "worker", "-c", "1", "--sweep-interval", "0.1"),
        cwd=workdir,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _done(db: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with SQLiteStore(db) as store:
        while (job := await store.get(KEY)) is None or not job.status.terminal:
            assert time.monotonic() < deadline, f"not done: {job}"
            await asyncio.sleep(0.1)


async def test_a_killed_process_workers_stream_is_resumed_by_the_next(tmp_path: Path) -> None:
    """The first worker's child streams and its checkpoints reach the record; SIGKILL the
    worker (its child goes too); the second worker's child resumes after the checkpoint:
    one create, one resume, the answer once."""
    db = tmp_path / "jobs.db"
    async with ResponsesServer() as server:
        server.script(text_events(PIECES), every=0.1)  # ~4 s of streaming
        server.resume_every = 0.01
        env = responses_env(server, db) | {"AI_LEASE_WORKER__ISOLATION": "process"}
        async with SQLiteStore(db) as store:
            runner = Runner(store, config=RunConfig(trace=False))
            await runner.submit(Job(KEY, input="hello", prompt_text="Say {{ input }}"))
        first = await _worker(tmp_path, env)
        second = None
        try:
            seen = await _checkpointed(db, KEY, 10, timeout_s=30)
            children = descendants(first.pid)
            first.send_signal(signal.SIGKILL)
            await first.wait()
            second = await _worker(tmp_path, env)
            await _done(db, timeout_s=60)
        finally:
            for worker in (first, second):
                if worker is not None and worker.returncode is None:
                    worker.send_signal(signal.SIGTERM)
                    await asyncio.wait_for(worker.communicate(), 30)
        assert second is not None and second.returncode == 0
        for _ in range(100):
            if all(gone(pid) for pid in children):
                break
            await asyncio.sleep(0.05)
        assert children and all(gone(pid) for pid in children), children
        assert (server.creates, server.resumes) == (1, 1)
        resumed = [r for r in server.requests if r.method == "GET"]
        query = parse_qs(urlsplit(resumed[0].path).query)
        assert int(query["starting_after"][0]) >= seen, resumed[0].path  # not from the start
    async with SQLiteStore(db) as store:
        job = await store.get(KEY)
    assert job is not None and job.status is Status.DONE and job.output == ANSWER, job
    assert job.checkpoint is None and job.takeovers >= 1
