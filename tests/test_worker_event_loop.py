"""`ai-lease worker --loop`: the worker runs on the event loop asked for, as a real process.

uvloop is tested on the SQLite store; the Redis store's own RESP fast path asserts an
``asyncio.Transport`` and is being replaced by redis-py (issue 13).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ai_lease import Status, open_store
from ai_lease.job import Job
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner

REAL_TIME = "the worker runs as a real process"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}


def _without_uvloop(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import uvloop`` fails, as where it is not installed."""
    blocker = tmp_path / "no_uvloop"
    blocker.mkdir()
    (blocker / "uvloop.py").write_text("raise ImportError('uvloop hidden by the test')\n")
    paths = [str(blocker), *filter(None, [os.environ.get("PYTHONPATH")])]
    return _env() | {"PYTHONPATH": os.pathsep.join(paths)}


async def _run_one_job(tmp_path: Path, loop: str, env: dict[str, str] | None = None) -> str:
    """Submit one job, run ``ai-lease worker --loop LOOP`` until it is DONE, stop it with
    SIGTERM; returns the worker's stderr (it exited 0)."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = open_store(url)
    try:
        await Runner(store, config=RunConfig(trace=False)).submit(
            Job("loop-job", input="One sentence to keep.", prompt_text="{{ input }}")
        )
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ai_lease", "--store", url, "worker", "--loop", loop),
            *("--sweep-interval", "0.1", "--provider", "local-extractive"),
            cwd=tmp_path,
            env=env or _env(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while (record := await store.get("loop-job")) is None or not record.status.terminal:
                assert time.monotonic() < deadline, "the worker did not run the job"
                assert worker.returncode is None, "the worker exited"
                await asyncio.sleep(0.1)
        finally:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(worker.communicate(), 20)
        assert worker.returncode == 0, err.decode()
        assert record.status is Status.DONE, record.last_error
        return err.decode()
    finally:
        await store.aclose()


async def test_worker_runs_a_job_on_uvloop(tmp_path: Path) -> None:
    """--loop uvloop: the worker runs on uvloop (it says so at start) and finishes a job."""
    pytest.importorskip("uvloop")
    err = await _run_one_job(tmp_path, "uvloop")
    assert "event loop uvloop" in err, err


async def test_worker_runs_a_job_on_asyncio(tmp_path: Path) -> None:
    """--loop asyncio (the default): the worker runs on asyncio's own loop."""
    err = await _run_one_job(tmp_path, "asyncio")
    assert "event loop asyncio" in err, err


async def test_auto_without_uvloop_runs_on_asyncio(tmp_path: Path) -> None:
    """--loop auto where uvloop is not installed: the worker runs on asyncio, no error."""
    err = await _run_one_job(tmp_path, "auto", _without_uvloop(tmp_path))
    assert "event loop asyncio" in err, err


def test_uvloop_asked_for_but_missing_is_exit_2(tmp_path: Path) -> None:
    """--loop uvloop without uvloop installed: exit 2, one line saying how to install it."""
    env = _without_uvloop(tmp_path)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "ai_lease", "--store", url, "worker", "--loop", "uvloop"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 2, out.stderr
    assert "uvloop is not installed" in out.stderr and "ai_lease[uvloop]" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "jobs.db").exists(), "the store was opened before the flags were read"
