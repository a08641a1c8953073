"""`ai-lease worker` as a user starts it: its flags are checked, its settings take effect."""

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
from ai_lease.lease.histogram import bucket_of
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner

REAL_TIME = "the worker runs as a subprocess"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["-c", "0"], "--concurrency"),
        (["--sweep-interval", "0"], "--sweep-interval"),
        (["--sweep-interval", "nan"], "--sweep-interval"),
        (["--sweep-interval", "inf"], "--sweep-interval"),
        (["--grace", "-1"], "--grace"),
        (["--grace", "nan"], "--grace"),
    ],
)
def test_worker_refuses_flags_that_cannot_work(tmp_path: Path, args: list[str], named: str) -> None:
    """worker -c 0, --sweep-interval 0/nan/inf, --grace -1/nan: exit 2 naming the flag."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "ai_lease", "--store", url, "worker", *args],
            cwd=tmp_path,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker {' '.join(args)} was accepted and ran")
    assert out.returncode == 2, out.stderr
    assert named in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "jobs.db").exists(), "the store was opened before the flags were read"


async def test_worker_runs_jobs_with_adaptive_budgets(tmp_path: Path) -> None:
    """[adaptive] reaches the worker's runner: a job's lease carries the learned budget."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    config = tmp_path / "settings.toml"
    config.write_text("[adaptive]\nenabled = true\nmin_samples = 1\nfloor = 0.25\n")
    store = open_store(url)
    try:
        # Every recorded load took ~10 ms: the learned load budget is the floor, 0.25 s
        # (the configured one, the ceiling, is 5 s).
        await store.add_durations({("default", "stage", "load"): {bucket_of(0.01): 50}})  # type: ignore[attr-defined]
        await Runner(store, config=RunConfig(trace=False)).submit(
            Job("adaptive-job", input="One sentence to keep.", prompt_text="{{ input }}")
        )
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ai_lease",
            "--config",
            str(config),
            "--store",
            url,
            "worker",
            "--sweep-interval",
            "0.1",
            cwd=tmp_path,
            env=_env(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 30
            while (record := await store.get("adaptive-job")) is None or not record.status.terminal:
                assert time.monotonic() < deadline, "the worker did not run the job"
                assert worker.returncode is None, "the worker exited"
                await asyncio.sleep(0.1)
        finally:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(worker.communicate(), 20)
        assert worker.returncode == 0, err.decode()
        assert record.status is Status.DONE, record.last_error
        assert record.max_no_progress == pytest.approx(0.25), record
        assert "adaptive budgets on" in err.decode()
    finally:
        await store.aclose()
