"""The commands that look — `ls`, `status --watch`, `workers` — through the real entry point
as a subprocess, on SQLite and on a real redis-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from ai_lease import Acquired, open_store
from ai_lease.lease.fence import Fence
from ai_lease.lease.queue import WorkerInfo
from tests.test_cli_basics import run_cli


def acquire(url: str, key: str) -> Fence:
    async def work() -> Fence:
        store = open_store(url)
        try:
            won = await store.acquire(key, "node-a", ttl=30, max_no_progress=5)
            assert isinstance(won, Acquired)
            return won.fence
        finally:
            await store.aclose()

    return asyncio.run(work())


def commit(url: str, fence: Fence, result: str) -> None:
    async def work() -> None:
        store = open_store(url)
        try:
            await store.commit(fence, result)
        finally:
            await store.aclose()

    asyncio.run(work())


def test_ls_header_age_duration_since_limit_json(store_url: str, tmp_path: Path) -> None:
    """ls: a header row, each job's age and duration; --since keeps the recent ones (and
    refuses a bad form naming the good ones, exit 2); --limit is bounded; --json lines carry
    the health and the result decoded once (a JSON result is JSON, not a string of JSON)."""
    acquire(store_url, "old-job")
    time.sleep(6.5)  # real: the CLI runs as a subprocess; ages are read off the store's clock
    commit(store_url, acquire(store_url, "done-job"), orjson.dumps({"answer": 42}).decode())
    acquire(store_url, "running-job")
    # --since first, while the new jobs are well under 5 s old however slowly this CLI starts
    # on a loaded machine (old-job is over 6.5 s old by then, and only gets older)
    recent = run_cli("--store", store_url, "ls", "--since", "5s", cwd=tmp_path)
    assert {r.split()[0] for r in recent.stdout.splitlines()[1:]} == {"done-job", "running-job"}
    out = run_cli("--store", store_url, "ls", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["KEY", "STATUS", "HEALTH", "STAGE", "AGE", "DURATION", "IDLE", "BEAT"]
    assert {row.split()[0] for row in rows} == {"old-job", "done-job", "running-job"}
    [old] = [row for row in rows if row.startswith("old-job")]
    assert float(old.split()[4]) >= 6.5 and old.split()[5] == "s", old  # its age
    one = run_cli("--store", store_url, "ls", "--limit", "1", cwd=tmp_path)
    assert len(one.stdout.splitlines()) == 2
    for bad in ("1y", "3", "0s", "-5m", "1.5h"):
        refused = run_cli("--store", store_url, "ls", "--since", bad, cwd=tmp_path)
        assert refused.returncode == 2 and "30s, 15m, 1h or 7d" in refused.stderr, bad
    too_many = run_cli("--store", store_url, "ls", "--limit", "10001", cwd=tmp_path)
    assert too_many.returncode == 2 and "10000" in too_many.stderr
    as_json = run_cli("--store", store_url, "ls", "--json", cwd=tmp_path)
    by_key = {r["key"]: r for r in map(orjson.loads, as_json.stdout.splitlines())}
    assert by_key["done-job"]["result"] == {"answer": 42}
    assert by_key["done-job"]["health"] is None
    assert by_key["running-job"]["health"] == "healthy"


def watch(url: str, key: str, cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    args = ["--store", url, "status", key, "--watch", "--interval", "0.2"]
    return subprocess.Popen(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()


def test_status_watch_ends_when_the_job_ends(store_url: str, tmp_path: Path) -> None:
    """status --watch shows the running job, keeps looking, and exits 0 once it is DONE,
    having shown the DONE record last."""
    fence = acquire(store_url, "job-1")
    proc = watch(store_url, "job-1", tmp_path)
    try:
        assert first_line(proc).split() == ["status", "RUNNING"]
        time.sleep(0.5)  # real: the CLI runs as a subprocess; ages are read off the store's clock
        assert proc.poll() is None  # still watching a running job
        commit(store_url, fence, '"ok"')
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()  # a no-op if it ended; reaped and its pipes closed either way
        proc.communicate()
    assert proc.returncode == 0, err
    last_block = out.strip().split("\n\n")[-1]
    assert last_block.splitlines()[0].split() == ["status", "DONE"]


def test_status_watch_ctrl_c_exits_130_quietly(store_url: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) during a watch: exit 130, nothing on stderr (no traceback)."""
    acquire(store_url, "job-1")
    proc = watch(store_url, "job-1", tmp_path)
    try:
        assert first_line(proc).split() == ["status", "RUNNING"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()  # a no-op if it ended; reaped and its pipes closed either way
        proc.communicate()
    assert proc.returncode == 130 and err == "", err


def test_status_watch_of_an_unknown_job_is_bad_input(store_url: str, tmp_path: Path) -> None:
    acquire(store_url, "other-job")  # the store exists: a look at a missing one is exit 4
    out = run_cli("--store", store_url, "status", "nope", "--watch", cwd=tmp_path)
    assert out.returncode == 2 and "'nope'" in out.stderr


def test_workers_header_and_relative_times(store_url: str, tmp_path: Path) -> None:
    """workers: a header row, running/concurrency, and when each started and last beat as
    relative times (not raw store-clock seconds)."""

    async def beat() -> None:
        store = open_store(store_url)
        try:
            info = WorkerInfo("w-1", "host-a", 4242, 1, 4, time.time(), time.time() - 300)
            await store.worker_beat(info, 30)  # type: ignore[attr-defined]
        finally:
            await store.aclose()

    asyncio.run(beat())
    out = run_cli("--store", store_url, "workers", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["WORKER", "HOST", "PID", "RUNNING", "STARTED", "LAST", "SEEN"]
    assert row.split()[:4] == ["w-1", "host-a", "4242", "1/4"]
    assert row.split()[4:6] == ["5", "min"] and row.endswith(" s ago"), row


def test_status_watch_of_an_ended_job_prints_once_and_exits(store_url: str, tmp_path: Path) -> None:
    """A job already DONE: --watch shows it once and exits 0; with --json, one JSON line."""
    commit(store_url, acquire(store_url, "job-1"), '"ok"')
    out = run_cli("--store", store_url, "status", "job-1", "--watch", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.splitlines()
    assert orjson.loads(line)["status"] == "DONE"
