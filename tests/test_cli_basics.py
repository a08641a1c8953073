"""The ai-lease entry point, run as a subprocess: help, status, bad input."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from ai_lease import Acquired, open_store


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_reads_well(tmp_path: Path) -> None:
    """--help lists the commands and exits 0 without touching any store."""
    out = run_cli("--help", cwd=tmp_path)
    assert out.returncode == 0 and "status" in out.stdout and "config" in out.stdout
    assert not (tmp_path / ".ai-lease").exists()


def test_status_shows_record_and_health(tmp_path: Path) -> None:
    """status prints the job's owner, token and health from the embedded store."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> int:
        store = open_store(url)
        won = await store.acquire("job-1", "node-a", ttl=30, max_no_progress=5)
        await store.aclose()
        assert isinstance(won, Acquired)
        return won.fence.token

    token = asyncio.run(seed())
    out = run_cli("--store", url, "status", "job-1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "RUNNING" in out.stdout and "healthy" in out.stdout and str(token) in out.stdout
    js = run_cli("--store", url, "status", "job-1", "--json", cwd=tmp_path)
    assert '"owner_id": "node-a"' in js.stdout


def test_unknown_job_is_bad_input(tmp_path: Path) -> None:
    """An unknown key in an existing store exits 2 with one line naming it, no traceback."""
    url = f"sqlite:///{tmp_path / 'j.db'}"

    async def make() -> None:
        store = open_store(url)
        await store.get("other")
        await store.aclose()

    asyncio.run(make())
    out = run_cli("--store", url, "status", "nope", cwd=tmp_path)
    assert out.returncode == 2
    assert "'nope'" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_config_is_one_clear_error(tmp_path: Path) -> None:
    """A misspelt AI_LEASE_ variable and a bad URL scheme exit 2 naming the problem only."""
    out = run_cli("status", "x", cwd=tmp_path, env={"AI_LEASE_LEASE__TLL": "3"})
    assert out.returncode == 2 and "AI_LEASE_LEASE__TLL" in out.stderr
    assert "Traceback" not in out.stderr
    bad = run_cli("--store", "ftp://u:sk-CANARY@h/x", "status", "x", cwd=tmp_path)
    assert bad.returncode == 2 and "sqlite://" in bad.stderr and "CANARY" not in bad.stderr


def test_debug_shows_traceback(tmp_path: Path) -> None:
    """--debug lets the traceback through for bug reports."""
    out = run_cli(
        "--debug", "--store", f"sqlite:///{tmp_path / 'j.db'}", "status", "x", cwd=tmp_path
    )
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_ls_lists_jobs_by_status_and_health(tmp_path: Path) -> None:
    """ls shows each job with status and health; --status and --health filter."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> None:
        store = open_store(url)
        a = await store.acquire("running-job", "node-a", ttl=30, max_no_progress=5)
        b = await store.acquire("done-job", "node-a", ttl=30, max_no_progress=5)
        assert isinstance(a, Acquired) and isinstance(b, Acquired)
        await store.commit(b.fence, '"ok"')
        await store.aclose()

    asyncio.run(seed())
    out = run_cli("--store", url, "ls", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "running-job" in out.stdout and "healthy" in out.stdout and "done-job" in out.stdout
    done = run_cli("--store", url, "ls", "--status", "done", cwd=tmp_path)
    assert "done-job" in done.stdout and "running-job" not in done.stdout
    healthy = run_cli("--store", url, "ls", "--health", "healthy", cwd=tmp_path)
    header, first, *_ = healthy.stdout.splitlines()
    assert header.split()[0] == "KEY" and first.split()[0] == "running-job"
