"""Resume instead of re-calling, end to end: an owner process SIGKILLed mid-stream, a
second ``ai-lease submit`` takes the job over and resumes the same background response.

Two real OS processes, a real SQLite store, the loopback Responses server: the model is
paid once (one create request), and the committed result is the whole answer, once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.responses_server import ResponsesServer, text_events

REAL_TIME = "the owner is an OS process, SIGKILLed mid-stream"


PIECES = [f"w{i:02d}," for i in range(40)]
ANSWER = "".join(PIECES)
JOB = 'key = "resume-e2e"\ninput = "hello"\nprompt_text = "Say {{ input }}"\n'


def _env(server: ResponsesServer, db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    return env | {
        "AI_LEASE_STORE__URL": f"sqlite:///{db}",
        "AI_LEASE_PROVIDER__NAME": "openai-responses",
        "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
        "AI_LEASE_PROVIDER__API_KEY": "sk-test-resume",
        "AI_LEASE_PROVIDER__MODEL": "m",
        "AI_LEASE_PROVIDER__BACKGROUND": "true",
        "AI_LEASE_LEASE__TTL": "2",
        "AI_LEASE_LEASE__RENEW_INTERVAL": "0.3",
        "AI_LEASE_STORE__OP_TIMEOUT": "0.25",
        "AI_LEASE_LEASE__SELF_FENCE_MARGIN": "0.5",
    }


async def _submit(workdir: Path, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "ai_lease", "submit", "job.toml", "--json"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


async def _checkpointed(db: Path, key: str, at_least: int, timeout_s: float) -> int:
    """Wait until the record holds a checkpoint past sequence ``at_least``; its sequence."""
    deadline = time.monotonic() + timeout_s
    async with SQLiteStore(db) as store:
        while time.monotonic() < deadline:
            job = await store.get(key)
            if job is not None and job.checkpoint:
                sequence = int(orjson.loads(job.checkpoint)["sequence"])
                if sequence >= at_least:
                    return sequence
            await asyncio.sleep(0.05)
    raise AssertionError(f"no checkpoint past sequence {at_least} within {timeout_s} s")


@pytest.mark.slow
async def test_sigkilled_owner_is_resumed_not_recalled(tmp_path: Path) -> None:
    """The owner dies mid-stream; the follower resumes the response: one create request,
    one resume, and the stored result equals the whole answer exactly once."""
    (tmp_path / "job.toml").write_text(JOB)
    db = tmp_path / "jobs.db"
    async with ResponsesServer() as server:
        server.script(text_events(PIECES), every=0.1)  # ~4 s of streaming
        server.resume_every = 0.01
        env = _env(server, db)
        owner = await _submit(tmp_path, env)
        try:
            seen = await _checkpointed(db, "resume-e2e", 10, timeout_s=30)
            owner.send_signal(signal.SIGKILL)
            await owner.wait()
            follower = await _submit(tmp_path, env)
            out, err = await asyncio.wait_for(follower.communicate(), 60)
        finally:
            if owner.returncode is None:
                owner.kill()
        assert follower.returncode == 0, err.decode()[-2000:]
        assert server.creates == 1 and server.resumes == 1, (server.creates, server.resumes)
        resumed = [r for r in server.requests if r.method == "GET"]
        query = parse_qs(urlsplit(resumed[0].path).query)
        assert int(query["starting_after"][0]) >= seen, resumed[0].path  # not from the start
    async with SQLiteStore(db) as store:
        job = await store.get("resume-e2e")
    assert job is not None and job.output == ANSWER, job
    assert job.checkpoint is None  # the commit cleared it
    assert job.takeovers >= 1
    assert (job.provider, job.model) == ("openai-responses", "m")  # what ran, named
    assert ANSWER in out.decode()
