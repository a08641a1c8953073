"""Take the README's dashboard screenshots from real runs:

    python -m tests.browser.screenshots [--out docs/img]

writes ``ui-jobs.png`` (the jobs page leading with its summary: counts by status and
health, the zombie that keeps renewing while its stream hangs and a failed job under "needs
attention", the last hour's charts, then finished jobs, a working owner, a cancelled job and
a taken-over one), ``ui-takeover-timeline.png`` (the taken-over job's timeline and its
legend: owner A stalls, B takes over with a higher token, A's late write is rejected, each
owner's model call on its lane) and ``ui-workers.png`` (a live worker's running job with
its health, and what it finished lately). Everything is real but the failed job (store
operations: no scripted model fails a job): node and worker processes running Runners on a
fresh SQLite store, the real ``ai-lease ui``, Debian's headless Chromium — the same parts
the browser tests use (tests/browser/support.py). It also writes ``pages.sha256``, the
digest of the page sources the pictures show (:func:`pages_digest`): a test fails when
the pages change and the pictures were not taken again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from ai_lease import open_store
from ai_lease.job import Job
from ai_lease.lease.base import Acquired
from ai_lease.run.runner import Runner
from tests.browser.support import (
    MNP,
    RENEW,
    TTL,
    finish,
    run_ok,
    run_takeover,
    start_browser,
    start_slow,
    wait_for,
)
from tests.harness.node import Cluster
from tests.harness.ui_server import UIServer
from tests.harness.worker_proc import Workers

__all__ = ["DIGEST", "PICTURES", "fail_job", "main", "pages_digest", "take"]

REPO_ROOT = Path(__file__).resolve().parents[2]
PICTURES = ("ui-jobs.png", "ui-takeover-timeline.png", "ui-workers.png")
DIGEST = "pages.sha256"
UI = REPO_ROOT / "ai_lease" / "ui"
PAGE_SOURCES = ("templates", "static", "timeline_svg.py", "timeline_spans.py", "charts.py")


def pages_digest() -> str:
    """The SHA-256 of what the pages are drawn from (templates, static files, the SVG
    modules), in a fixed order: the pictures are current while it is unchanged."""
    digest = hashlib.sha256()
    for name in PAGE_SOURCES:
        path = UI / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                digest.update(file.relative_to(UI).as_posix().encode() + b"\0")
                digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


async def fail_job(url: str, key: str, owner: str = "worker-9#1.ab") -> None:
    """``key`` FAILED by ``owner`` (store operations)."""
    store = open_store(url)
    try:
        got = await store.acquire(key, owner, ttl=30, max_no_progress=5)
        assert isinstance(got, Acquired), got
        await store.fail(got.fence, "ProviderFailed: 400 the prompt is too long")
    finally:
        await store.aclose()


async def submit(url: str, key: str) -> None:
    """Record ``key`` for workers (its input is its key)."""
    store = open_store(url)
    try:
        await Runner(store).submit(Job(key, input=key, prompt_text="{{ input }}"))
    finally:
        await store.aclose()


TAKEN_OVER = "report-42"
DONE = ("summary-2026-11-30", "translate-fr-17", "invoice-8812")


async def zombie(url: str, directory: Path) -> Cluster:
    """A job whose stream hangs under the ``alert`` policy: the keeper keeps renewing, so the
    record reads zombie (heartbeat fresh, progress stale)."""
    cluster = Cluster(url, "nightly-digest", directory, ttl=TTL, renew=RENEW, mnp=MNP)
    cluster.policy = "alert"
    owner = await cluster.start("worker-3", "hang-async")
    await owner.wait_for_event("acquired", "the zombie to own its job")
    return cluster


async def cancelled(url: str, directory: Path) -> None:
    """A running job cancelled by an operator (its owner stops)."""
    cluster, owner = await start_slow(url, "backfill-2026-q3", directory, 60, node="worker-2")
    async with cluster:
        store = open_store(url)
        try:
            await store.cancel("backfill-2026-q3", "superseded by backfill-2026-q4")
        finally:
            await store.aclose()
        await owner.exited()


async def fill(url: str, directory: Path, workers: Workers) -> list[Cluster]:
    """The store the pictures show; returns the clusters still running (close them)."""
    (directory / "zombie").mkdir()
    takeover = await run_takeover(url, TAKEN_OVER, directory / "takeover")
    for index, key in enumerate(DONE):
        await run_ok(url, key, directory / key, node=f"worker-{index % 2 + 1}")
    await cancelled(url, directory / "cancelled")
    await fail_job(url, "render-7")
    await finish(takeover)
    await workers.start_ready("worker-4", concurrency=2, job_seconds=0)
    await submit(url, "thumbnail-301")
    await submit(url, "thumbnail-302")
    await asyncio.sleep(2.0)  # both done by worker-4
    await workers.procs["worker-4"].kill()
    await workers.start_ready("worker-4", concurrency=2, job_seconds=300)
    await submit(url, "embed-catalogue")
    slow, _ = await start_slow(url, "summary-2026-12", directory / "slow", 120, node="worker-1")
    return [slow, await zombie(url, directory / "zombie")]


def shoot(driver: WebDriver, ui: UIServer, out: Path) -> list[Path]:
    """The three screenshots, once the zombie's badge reads zombie; then the digest."""
    driver.get(ui.url("/jobs"))
    badge = "#attention tr[data-key='nightly-digest'] .health-zombie"
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, badge), "the zombie", timeout=30)
    time.sleep(1.5)  # the live clocks tick once more
    jobs, timeline, workers = (out / name for name in PICTURES)
    driver.save_screenshot(str(jobs))
    driver.get(ui.url(f"/jobs/{TAKEN_OVER}"))
    wait_for(driver, lambda d: d.find_elements(By.ID, "timeline"), "the timeline")
    timeline.write_bytes(driver.find_element(By.ID, "timeline-figure").screenshot_as_png)
    driver.get(ui.url("/workers"))
    health = "tr.worker[data-id='worker-4'] .running-job .badge"
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, health), "worker-4's job")
    workers.write_bytes(driver.find_element(By.ID, "workers").screenshot_as_png)
    (out / DIGEST).write_text(pages_digest() + "\n")
    return [jobs, timeline, workers, out / DIGEST]


async def take(out: Path) -> list[Path]:
    """Fill a fresh store, serve it, and write the screenshots into ``out`` (a folder)."""
    with tempfile.TemporaryDirectory(prefix="ai-lease-shots-") as tmp:
        directory = Path(tmp)
        url = f"sqlite:///{directory / 'ai-lease.db'}"
        (directory / "workers").mkdir()
        async with Workers(url, directory / "workers") as workers:
            running = await fill(url, directory, workers)
            try:
                with UIServer(url, directory) as ui:
                    driver = start_browser(1280, 1000)
                    try:
                        return shoot(driver, ui, out)
                    finally:
                        with contextlib.suppress(Exception):
                            driver.get("about:blank")
                        driver.quit()
            finally:
                for cluster in running:
                    await cluster.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.browser.screenshots")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "img")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in asyncio.run(take(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
