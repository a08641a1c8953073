"""A worker, the dashboard and `submit --detach` as an operator runs them: real processes.

On each store (SQLite, Redis, PostgreSQL) the test starts ``ai-lease worker`` (its settings
name the offline provider) and ``ai-lease ui``, submits with ``--detach`` a job file whose
``[provider]`` table names an OpenAI-compatible server (the test's own, streaming slowly),
and while the worker runs it reads every dashboard page and ``status`` / ``ls --json``; then
``result`` must be that server's answer.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.harness.sse_server import SSEServer, drip, sse
from tests.harness.ui_server import UIServer, ui_env

REAL_TIME = "a worker, the dashboard and the CLI are real processes"


pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ANSWER = "the answer from the job's own provider, streamed slowly"
PAGES = ("/", "/jobs", "/jobs/{key}", "/workers", "/login", "/metrics", "/healthz")


async def cli(cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``python -m ai_lease *args`` to its end: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ai_lease", *args, cwd=cwd, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def wait_status(cwd: Path, env: dict[str, str], key: str, want: set[str]) -> dict:
    """Poll ``status KEY --json`` until the job's status is one of ``want``."""
    deadline, last = time.monotonic() + 90, ""
    while time.monotonic() < deadline:
        code, out, err = await cli(cwd, env, "status", key, "--json")
        last = f"exit {code}: {out}{err}"
        if code == 0 and json.loads(out)["status"] in want:
            return dict(json.loads(out))
        await asyncio.sleep(0.3)
    raise AssertionError(f"job {key!r} never reached {want}; last status: {last}")


def job_file(directory: Path, model_url: str) -> Path:
    path = directory / "job.toml"
    path.write_text(
        'key = "scenario-1"\ninput = "Some text. To answer."\nprompt_text = "{{ input }}"\n'
        f'[provider]\nname = "openai-compatible"\nmodel = "m"\nbase_url = "{model_url}"\n'
    )
    return path


async def test_worker_dashboard_and_detached_job(store_url: str, tmp_path: Path) -> None:
    """A detached job runs on its own [provider] while every dashboard page answers 200
    (on each store: ``store_url`` is SQLite, Redis and PostgreSQL)."""
    url = store_url
    async with SSEServer(responder=lambda r: sse(*drip(ANSWER, every=0.3, chunk_size=2))) as model:
        # the worker's operator lists the job's model server: a job may not pick any host
        env = ui_env(
            url,
            {
                "AI_LEASE_PROVIDER__NAME": "local-extractive",
                "AI_LEASE_PROVIDER__ALLOWED_HOSTS": f"127.0.0.1:{model.port}",
            },
        )
        job = job_file(tmp_path, model.base_url)
        with (tmp_path / "worker.log").open("wb") as log:
            worker = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "ai_lease", "worker", "-c", "2", cwd=tmp_path, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        ui = await asyncio.to_thread(UIServer(url, tmp_path).start)
        try:
            await _scenario(tmp_path, env, job, ui, model, worker.pid)
        finally:
            await asyncio.to_thread(ui.stop)
            worker.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(worker.wait(), 60)
        assert code == 0, (tmp_path / "worker.log").read_text()[-3000:]


async def _scenario(
    cwd: Path, env: dict[str, str], job: Path, ui: UIServer, model: SSEServer, worker_pid: int
) -> None:
    code, out, err = await cli(cwd, env, "submit", str(job), "--detach")
    assert code == 0, err
    key = out.strip().splitlines()[-1]
    assert key == "scenario-1", out
    running = await wait_status(cwd, env, key, {"RUNNING", "DONE", "FAILED"})
    assert running["status"] == "RUNNING", running  # the slow stream keeps it running
    assert "health" in running, sorted(running)  # status --json carries health, like ls --json
    async with httpx.AsyncClient(base_url=ui.base_url, timeout=10, follow_redirects=True) as http:
        for page in PAGES:
            reply = await http.get(page.format(key=key))
            assert reply.status_code == 200, f"{page}: {reply.status_code} {reply.text[:500]}"
        workers = await http.get("/workers")
        assert str(worker_pid) in workers.text, workers.text[:2000]  # the live worker, by pid
    code, out, err = await cli(cwd, env, "ls", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [line["key"] for line in lines] == [key] and "health" in lines[0], out
    done = await wait_status(cwd, env, key, {"DONE", "FAILED", "CANCELLED"})
    assert done["status"] == "DONE", done
    code, out, err = await cli(cwd, env, "result", key)
    assert (code, out.strip()) == (0, ANSWER), (code, out, err)
    assert len(model.requests) >= 1  # the job's own server was called
    code, out, err = await cli(cwd, env, "status", key, "--json")
    listed = json.loads(
        next(line for line in (await cli(cwd, env, "ls", "--json"))[1].splitlines() if line)
    )
    # Two reads of one stored record: only the figures of the moment of reading differ.
    of_the_read = {"read_at", "since_heartbeat", "since_progress", "lease_remaining"}
    status = json.loads(out)
    assert set(status) == set(listed), "status --json and ls --json have the same fields"
    assert {k: v for k, v in status.items() if k not in of_the_read} == {
        k: v for k, v in listed.items() if k not in of_the_read
    }, "status --json and ls --json are the same object per job"
