"""φ of an owner's renewals, as the store saw them: health's ``suspect`` detail in
``status``, ``status --json`` and the dashboard's job page, on SQLite and Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from ai_lease import Acquired, open_store
from ai_lease.job import Health
from ai_lease.lease.base import JobTimeline, LeaseStore
from ai_lease.lease.fence import Fence
from ai_lease.observe.phi import is_suspect, renewal_phi
from ai_lease.ui.render import Templates, job_context
from tests.test_cli_basics import run_cli

KEY = "phi-job"
BEAT = 0.1  # the owner renews every 100 ms: φ 8 after 0.1 + 5.61 x 0.1 s ≈ 0.66 s of silence


async def renewing_owner(store: LeaseStore, beats: int) -> Fence:
    """An owner that acquired ``KEY`` and renewed ``beats`` times, BEAT apart, then stopped.
    Its record says renew_interval 5 s, so health keeps reading ``healthy`` meanwhile."""
    won = await store.acquire(KEY, "node-a", ttl=30, max_no_progress=30, renew_interval=5)
    assert isinstance(won, Acquired)
    for version in range(1, beats + 1):
        await asyncio.sleep(BEAT)
        renewal = await store.renew(
            won.fence, ttl=30, stage="call_ai", progress_version=version,
            max_no_progress=30, grace=5,
        )  # fmt: skip
        assert renewal.ok
    return won.fence


async def phi_now(store: LeaseStore) -> tuple[float | None, Health | None]:
    job = await store.get(KEY)
    assert job is not None and isinstance(store, JobTimeline)
    entries, _ = await store.timeline(KEY)
    return renewal_phi(entries, job), job.health()


async def test_silent_owner_is_suspect_before_its_heartbeat_reads_lost(store_url: str) -> None:
    """Renewals 100 ms apart, then silence: φ < 8 at first, ≥ 8 within 2 s, health healthy."""
    store = open_store(store_url)
    try:
        await renewing_owner(store, beats=12)
        phi, health = await phi_now(store)
        assert phi is not None and phi < 8 and not is_suspect(phi, health)
        await asyncio.sleep(1.5)
        phi, health = await phi_now(store)
        assert health is Health.HEALTHY  # the heartbeat rule waits for 5 s + grace
        assert phi is not None and phi >= 8 and is_suspect(phi, health)
    finally:
        await store.aclose()


async def test_a_job_that_is_not_running_has_no_phi(store_url: str) -> None:
    """A committed job has no owner to suspect: φ is None, and the page shows no row."""
    store = open_store(store_url)
    try:
        fence = await renewing_owner(store, beats=2)
        await store.commit(fence, '"ok"')
        job = await store.get(KEY)
        assert job is not None and isinstance(store, JobTimeline)
        entries, dropped = await store.timeline(KEY)
        assert renewal_phi(entries, job) is None
        page = Templates().render("_job_live.html", **job_context(job, entries, dropped))
        assert 'id="phi"' not in page
    finally:
        await store.aclose()


def test_status_text_json_and_page_show_the_suspicion(tmp_path: Path) -> None:
    """A silent owner reads 'healthy, suspect' with a φ row in status, --json and the page."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> str:
        store = open_store(url)
        try:
            await renewing_owner(store, beats=10)
            await asyncio.sleep(1.5)
            job = await store.get(KEY)
            assert job is not None and isinstance(store, JobTimeline)
            entries, dropped = await store.timeline(KEY)
            return Templates().render("_job_live.html", **job_context(job, entries, dropped))
        finally:
            await store.aclose()

    page = asyncio.run(seed())
    assert 'id="phi">φ ' in page and ": suspect (threshold 8)" in page
    out = run_cli("--store", url, "status", KEY, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "healthy, suspect" in out.stdout and "suspicion   φ " in out.stdout
    js = orjson.loads(run_cli("--store", url, "status", KEY, "--json", cwd=tmp_path).stdout)
    assert js["phi"] >= 8 and js["suspect"] is True
