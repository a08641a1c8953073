"""Take the README's dashboard screenshots from real runs:

    python -m tests.browser.screenshots [--out docs/img]

writes ``ui-jobs.png`` (the jobs page: finished jobs, a working owner, a zombie that keeps
renewing while its stream hangs, a cancelled job and a taken-over one) and
``ui-takeover-timeline.png`` (the taken-over job's timeline: owner A stalls, B takes over
with a higher token, A's late write is rejected). Everything is real: node processes
running Runners on a fresh SQLite store, the real ``ai-lease ui``, Debian's headless Chromium.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from ai_lease import open_store
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

__all__ = ["main", "take"]

REPO_ROOT = Path(__file__).resolve().parents[2]
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


async def fill(url: str, directory: Path) -> list[Cluster]:
    """The store the pictures show; returns the clusters still running (close them)."""
    (directory / "zombie").mkdir()
    takeover = await run_takeover(url, TAKEN_OVER, directory / "takeover")
    for index, key in enumerate(DONE):
        await run_ok(url, key, directory / key, node=f"worker-{index % 2 + 1}")
    await cancelled(url, directory / "cancelled")
    await finish(takeover)
    slow, _ = await start_slow(url, "embed-catalogue", directory / "slow", 120, node="worker-1")
    return [slow, await zombie(url, directory / "zombie")]


def shoot(driver: WebDriver, ui: UIServer, out: Path) -> list[Path]:
    """The two screenshots, once the zombie's badge reads zombie."""
    driver.get(ui.url("/jobs"))
    badge = "tr.job[data-key='nightly-digest'] .health-zombie"
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, badge), "the zombie", timeout=30)
    time.sleep(1.5)  # the live clocks tick once more
    jobs = out / "ui-jobs.png"
    driver.save_screenshot(str(jobs))
    driver.get(ui.url(f"/jobs/{TAKEN_OVER}"))
    timeline = wait_for(driver, lambda d: d.find_elements(By.ID, "timeline"), "the timeline")[0]
    picture = out / "ui-takeover-timeline.png"
    picture.write_bytes(timeline.screenshot_as_png)
    return [jobs, picture]


async def take(out: Path) -> list[Path]:
    """Fill a fresh store, serve it, and write the screenshots into ``out`` (a folder)."""
    with tempfile.TemporaryDirectory(prefix="ai-lease-shots-") as tmp:
        directory = Path(tmp)
        url = f"sqlite:///{directory / 'ai-lease.db'}"
        running = await fill(url, directory)
        try:
            with UIServer(url, directory) as ui:
                driver = start_browser(1280, 720)
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
