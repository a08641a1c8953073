"""`ai-lease cancel / retry / rm / prune`, `submit --force` and an interrupted `submit` or
`demo`, through the real entry point as subprocesses on SQLite and Redis; and the store
operations under them (the JobAdmin contract) and the client's verbs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ai_lease import connect, open_store
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.testing.contract_queue import JobAdminContract
from tests.harness.sse_server import Hang, SSEServer, chat_chunks, sse
from tests.test_cli_submit import run_cli
from tests.test_redis_cluster import ClusterStore, cluster  # noqa: F401 (a fixture)


class TestAdminContract(JobAdminContract):
    """Both built-in stores, via the parametrized ``store`` fixture."""


class TestClusterAdmin(ClusterStore, JobAdminContract):
    """On Redis Cluster: each job's script on its own slot, the namespace's keys apart."""


def _on(url: str, work: Any) -> Any:
    """Run ``work(store)`` against ``url`` (a fresh connection each time)."""

    async def go() -> Any:
        store = open_store(url)
        try:
            return await work(store)
        finally:
            await store.aclose()

    return asyncio.run(go())


def _record(url: str, key: str) -> dict[str, Any] | None:
    job = _on(url, lambda store: store.get(key))
    return None if job is None else job.to_dict() | {"read_at": 0}


async def _prepare(store: Any) -> None:
    """failed, running (a live lease), done, pending (submitted)."""
    for key in ("failed", "running", "done"):
        won = await store.acquire(key, "A", ttl=60, max_no_progress=60)
        assert isinstance(won, Acquired)
        if key == "failed":
            await store.fail(won.fence, "broken")
        if key == "done":
            await store.commit(won.fence, '"r"')
    await store.submit("pending", "{}", "fp")


def _cli(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--store", url, *args, cwd=tmp_path)


def test_cancel_and_retry_refuse_what_they_cannot_do(store_url: str, tmp_path: Path) -> None:
    """cancel of a DONE job and retry of a RUNNING, PENDING or DONE job exit 2 and change
    nothing; an unknown key exits 2 naming it; retry of a FAILED job makes it due again."""
    _on(store_url, _prepare)
    before = {key: _record(store_url, key) for key in ("running", "pending", "done")}
    done = _cli(store_url, tmp_path, "cancel", "done")
    assert done.returncode == 2 and "already ended DONE" in done.stderr, done.stderr
    for key in ("running", "pending", "done"):
        out = _cli(store_url, tmp_path, "retry", key)
        assert out.returncode == 2 and "only a FAILED or CANCELLED" in out.stderr, out.stderr
    assert {key: _record(store_url, key) for key in before} == before
    for command in ("cancel", "retry", "rm"):
        out = _cli(store_url, tmp_path, command, "nope")
        assert out.returncode == 2 and "no job 'nope'" in out.stderr, (command, out.stderr)
    out = _cli(store_url, tmp_path, "retry", "failed")
    assert out.returncode == 0 and "retried failed" in out.stdout, out.stderr
    job = _on(store_url, lambda store: store.get("failed"))
    assert job.status is Status.PENDING and job.attempts == 0 and job.owner_id is None
    assert "failed" in _on(store_url, lambda store: store.due(100))


def test_cancel_then_retry_and_rm(store_url: str, tmp_path: Path) -> None:
    """A cancelled running job: its owner is fenced out, retry makes it PENDING; rm keeps a
    live job unless --force; rm removes the record."""
    _on(store_url, _prepare)
    out = _cli(store_url, tmp_path, "rm", "running")
    assert out.returncode == 2 and "--force" in out.stderr and "live lease" in out.stderr
    assert _record(store_url, "running")["status"] == "RUNNING"  # type: ignore[index]
    out = _cli(store_url, tmp_path, "rm", "running", "--force")
    assert out.returncode == 0 and "removed running" in out.stdout, out.stderr
    assert _record(store_url, "running") is None
    assert _cli(store_url, tmp_path, "cancel", "pending", "--reason", "no").returncode == 0
    assert _cli(store_url, tmp_path, "retry", "pending").returncode == 0
    assert _record(store_url, "pending")["status"] == "PENDING"  # type: ignore[index]
    out = _cli(store_url, tmp_path, "rm", "pending")
    assert out.returncode == 0 and _record(store_url, "pending") is None
    assert "pending" not in _on(store_url, lambda store: store.due(100))


def test_prune_by_age_and_status(store_url: str, tmp_path: Path) -> None:
    """prune removes old terminal jobs (one status, or all three) and says how many; a bad
    duration exits 2 naming the accepted forms."""
    _on(store_url, _prepare)
    bad = _cli(store_url, tmp_path, "prune", "--older-than", "7 days")
    assert bad.returncode == 2 and "30s, 15m, 1h or 7d" in bad.stderr, bad.stderr
    assert _cli(store_url, tmp_path, "prune").returncode == 2  # --older-than is required
    young = _cli(store_url, tmp_path, "prune", "--older-than", "1h")
    assert young.returncode == 0 and young.stdout.strip() == "pruned 0 jobs"
    one = _cli(store_url, tmp_path, "prune", "--older-than", "0s", "--status", "DONE")
    assert one.returncode == 0 and one.stdout.strip() == "pruned 1 job", one.stderr
    assert _record(store_url, "done") is None and _record(store_url, "failed") is not None
    rest = _cli(store_url, tmp_path, "prune", "--older-than", "0s")
    assert rest.stdout.strip() == "pruned 1 job" and _record(store_url, "failed") is None
    assert _record(store_url, "running") and _record(store_url, "pending")


def test_a_cancelled_key_runs_again_only_with_force(store_url: str, tmp_path: Path) -> None:
    """submit of a CANCELLED key exits 2 naming --force (here or detached), nothing
    changed; with --force it is a new run under a higher token."""
    (tmp_path / "job.toml").write_text('key = "job-1"\nprompt = "summarize"\ninput = "A. B."\n')

    async def cancelled(store: Any) -> int:
        won = await store.acquire("job-1", "A", ttl=60, max_no_progress=60)
        await store.cancel("job-1", "ops")
        return int(won.fence.token)

    token = _on(store_url, cancelled)
    before = _record(store_url, "job-1")
    for extra in ([], ["--detach"]):
        out = _cli(store_url, tmp_path, "submit", "job.toml", "-q", *extra)
        assert out.returncode == 2 and "--force" in out.stderr, (extra, out.stderr)
        assert _record(store_url, "job-1") == before
    out = _cli(store_url, tmp_path, "submit", "job.toml", "-q", "--force")
    assert out.returncode == 0 and out.stdout.strip() == "A. B.", out.stderr
    job = _on(store_url, lambda store: store.get("job-1"))
    assert job.status is Status.DONE and job.token > token and job.attempts == 1


# -- interrupts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sig", "cancel"), [(signal.SIGINT, False), (signal.SIGTERM, True)], ids=["int", "term"]
)
async def test_an_interrupted_submit_hands_its_job_back(
    store_url: str, tmp_path: Path, sig: signal.Signals, cancel: bool
) -> None:
    """SIGINT/SIGTERM during a foreground submit: one line, exit 130, the lease released;
    the job left to workers (spec stored, due now), or cancelled with --cancel-on-interrupt."""
    (tmp_path / "job.toml").write_text('key = "held"\nprompt = "summarize"\ninput = "A. B."\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    async with SSEServer() as server:
        server.enqueue(sse(*chat_chunks(["A"], finish_reason=None), Hang()))
        env |= {
            "AI_LEASE_PROVIDER__NAME": "openai-compatible",
            "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
            "AI_LEASE_PROVIDER__MODEL": "m",
            "AI_LEASE_STREAM__IDLE": "60",
        }
        args = ["--store", store_url, "submit", "job.toml", "-q"]
        args += ["--cancel-on-interrupt"] if cancel else []
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "ai_lease", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        async with asyncio.timeout(30):
            while not server.requests:  # noqa: ASYNC110 (the model call started: lease held)
                # real: the CLI and its nodes run as subprocesses on a real store
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        held = await _get(store_url, "held")
        assert held.status is Status.RUNNING and held.lease_live
        proc.send_signal(sig)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1, err.decode()
    assert lines[0].startswith(f"ai-lease: interrupted ({sig.name})"), lines
    job = await _get(store_url, "held")
    if cancel:
        assert job.status is Status.CANCELLED and "cancelled" in lines[0]
        return
    assert "left to workers" in lines[0]
    assert job.status is Status.PENDING and not job.lease_live and job.spec is not None
    assert job.attempts == 0  # an interrupt is not a failed attempt
    store = open_store(store_url)
    try:
        assert "held" in await store.due(100)  # type: ignore[attr-defined]
    finally:
        await store.aclose()


async def _get(url: str, key: str) -> Any:
    store = open_store(url)
    try:
        return await store.get(key)
    finally:
        await store.aclose()


def test_demo_stops_on_ctrl_c(store_url: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops the demo
    and its nodes: one line, exit 130, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ai_lease", "--store", store_url, "demo"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ai-lease demo:")
        # real: the CLI and its nodes run as subprocesses on a real store
        time.sleep(2.0)  # the nodes are racing
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # reaped and its pipes closed, however it ended
    assert proc.returncode == 130, err
    said = "ai-lease: interrupted (SIGINT): demo stopped, its nodes too"
    assert err.strip().splitlines() == [said]


async def test_client_verbs(store_url: str) -> None:
    """Client.retry / remove / prune: the store operations, by key."""
    async with connect(store_url) as client:
        store = client.store
        await _prepare(store)
        retried = await client.retry("failed")
        assert retried is not None and retried.status is Status.PENDING
        kept = await client.remove("running")
        assert not kept.removed and kept.job is not None
        assert (await client.remove("running", force=True)).removed
        assert await client.prune(0.0, {"DONE"}) == 1
        assert await client.status("done") is None and await client.status("pending")
        with pytest.raises(Exception, match="terminal statuses only"):
            await client.prune(0.0, {"RUNNING"})
