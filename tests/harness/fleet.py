"""Real ``ai-lease worker`` processes for the fleet tests (tests/test_limits_*.py): started
with one settings file and a clean environment, stopped with SIGTERM (SIGKILL after a
timeout), their logs read back for an assertion's message."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ai_lease import Status
from tests.harness.node import REPO_ROOT

__all__ = ["start_workers", "stop_workers", "until_ended", "worker_logs"]

TERMINAL = tuple(status.value for status in Status if status.terminal)


async def start_workers(
    config: Path, tmp_path: Path, count: int, *args: str
) -> list[asyncio.subprocess.Process]:
    """``count`` workers on ``config`` (``--worker-id w0``…, then ``args``), each logging to
    ``tmp_path/worker<n>.log``; no ``AI_LEASE_*`` or ``OPENAI*`` variable of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env["OPENAI_API_KEY"] = "sk-test"  # a local server: any key
    procs = []
    for n in range(count):
        with (tmp_path / f"worker{n}.log").open("wb") as log:  # the process has its own copy
            procs.append(
                await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", "ai_lease", "--config", str(config), "worker"),
                    *("--worker-id", f"w{n}", *args),
                    cwd=REPO_ROOT,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            )
    return procs


async def stop_workers(procs: list[asyncio.subprocess.Process], timeout: float = 30) -> None:
    """SIGTERM each (a stopped one is sent SIGCONT first), SIGKILL what outlives ``timeout``."""
    for proc in procs:
        if proc.returncode is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def worker_logs(tmp_path: Path, tail: int = 2000) -> str:
    """The last ``tail`` characters of each worker's log, named."""
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}"
        for p in sorted(tmp_path.glob("worker*.log"))
    )


async def until_ended(
    store: Any, keys: list[str], tmp_path: Path, timeout: float, every: float
) -> list[Any]:
    """Each of ``keys``' records once every one has ended (DONE, FAILED or CANCELLED), the
    workers' logs in the assertion if that takes over ``timeout`` seconds. While they run, one
    count of the store's jobs per status every ``every`` seconds (of a store holding these
    jobs only), not a read of every record: the fleet's own pace is what is measured."""
    deadline = time.monotonic() + timeout
    while True:
        counts = await store.count_jobs()
        if sum(counts.get(status, 0) for status in TERMINAL) >= len(keys):
            records = [await store.get(key) for key in keys]
            if all(r is not None and r.status.terminal for r in records):
                return records
        assert time.monotonic() < deadline, worker_logs(tmp_path, 3000)
        await asyncio.sleep(every)  # real: the workers run the jobs in real time
