"""φ of an owner's renewals, as the store saw them: health's ``suspect`` detail in
``status``, ``status --json`` and the dashboard's job page, on SQLite and Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from ai_lease import Acquired, open_store
from ai_lease.job import Health
from ai_lease.lease.base import LeaseStore
from ai_lease.lease.fence import Fence
from ai_lease.lease.timeline import JobTimeline
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
        await asyncio.sleep(1.5)  # real: renewals are timed by the real store's clock
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
            await asyncio.sleep(1.5)  # real: renewals are timed by the real store's clock
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


async def test_the_dashboard_uses_the_configured_threshold(tmp_path: Path) -> None:
    """create_app(phi_threshold=10) (the CLI passes lease.phi_threshold): the job page and
    its live section measure φ against 10, not the default 8."""
    import httpx
    from httpx_sse import aconnect_sse

    from tests.test_ui_app import serving

    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        await renewing_owner(store, beats=10)
        pages = []
        async with (
            serving(store, refresh=0.1, phi_threshold=10.0) as base,
            httpx.AsyncClient(base_url=base) as client,
        ):
            pages.append((await client.get(f"/jobs/{KEY}")).text)
            async with aconnect_sse(client, "GET", f"/live/jobs/{KEY}") as source:
                async for event in source.aiter_sse():
                    pages.append(event.data)
                    break
    finally:
        await store.aclose()
    for text in pages:
        assert 'id="phi">φ ' in text and ("at 10)" in text or "threshold 10)" in text), text
        assert "at 8)" not in text and "threshold 8)" not in text


async def test_the_ui_command_passes_the_lease_phi_threshold(tmp_path: Path) -> None:
    """`ai-lease ui` with AI_LEASE_LEASE__PHI_THRESHOLD=10 serves φ against 10."""
    import os
    import socket
    import sys
    import time

    import httpx

    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = open_store(url)
    try:
        await renewing_owner(store, beats=10)
    finally:
        await store.aclose()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    server = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "ai_lease", "--store", url, "ui", "--port", str(port)),
        cwd=tmp_path,
        env={**env, "AI_LEASE_LEASE__PHI_THRESHOLD": "10"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            while True:
                try:
                    page = (await client.get(f"/jobs/{KEY}")).text
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and server.returncode is None
                    await asyncio.sleep(0.1)  # real: the dashboard is a subprocess on a socket
    finally:
        server.terminate()
        await server.wait()
    assert 'id="phi">φ ' in page and ("at 10)" in page or "threshold 10)" in page), page


def test_an_owner_that_never_renewed_has_phi_unknown_everywhere(tmp_path: Path) -> None:
    """An owner with only its acquisition (no gap yet) reads 'φ unknown', never φ 0, in the
    status text, status --json (phi null, the same phi_text) and the dashboard's page."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def seed() -> str:
        store = open_store(url)
        try:
            await renewing_owner(store, beats=0)
            job = await store.get(KEY)
            assert job is not None and isinstance(store, JobTimeline)
            entries, dropped = await store.timeline(KEY)
            return Templates().render("_job_live.html", **job_context(job, entries, dropped))
        finally:
            await store.aclose()

    page = asyncio.run(seed())
    unknown = "φ unknown (fewer than 2 heartbeats; suspect at 8)"
    assert f'id="phi">{unknown}<' in page
    out = run_cli("--store", url, "status", KEY, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"suspicion   {unknown}\n" in out.stdout and "suspect\n" not in out.stdout
    js = orjson.loads(run_cli("--store", url, "status", KEY, "--json", cwd=tmp_path).stdout)
    assert (js["phi"], js["phi_text"], js["suspect"]) == (None, unknown, False)


async def test_text_json_and_page_print_one_phi_value(store_url: str) -> None:
    """From one read, the status rows, the --json object and the page carry the same φ:
    the JSON number is the one the text prints, and the texts are equal."""
    from ai_lease.cli.look import job_and_phi
    from ai_lease.cli.record_view import describe, job_json
    from ai_lease.client import Client

    store = open_store(store_url)
    try:
        await renewing_owner(store, beats=6)
        # real: renewals are timed by the real store's clock
        await asyncio.sleep(0.5)  # φ somewhere between calm and far past the threshold
        job, phi, _ = await job_and_phi(Client(store), KEY)
        assert job is not None and phi is not None and isinstance(store, JobTimeline)
        entries, dropped = await store.timeline(KEY)
    finally:
        await store.aclose()
    row = dict(describe(job, 5.0, phi))["suspicion"]
    js = orjson.loads(orjson.dumps(job_json(job, 5.0, phi)))
    page = Templates().render("_job_live.html", **job_context(job, entries, dropped))
    assert js["phi_text"] == row and f'id="phi">{row}<' in page
    assert row.startswith(f"φ {js['phi']:.1f}") and js["phi"] == round(js["phi"], 1)
