"""What an operator sees at a glance, in Debian's headless Chromium over real runs: the jobs
page leading with what needs attention, the workers page's running jobs with their live
health and throughput, the job timeline's full width, legend and model calls.

The jobs and workers pages run on every store (SQLite, Redis, PostgreSQL: their listing
code differs); the timeline on SQLite (it is drawn the same from any store's entries).
Jobs come from real node and worker processes (a takeover, a zombie, a cancelled run, a
live worker); a failed job from store operations (no scripted model fails a job). Every
page is checked for console errors too (a CSP violation is one)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from ai_lease import open_store
from ai_lease.job import Status
from tests.browser.screenshots import cancelled, fail_job, submit, zombie
from tests.browser.support import StartUI, console_errors, finish, run_takeover, wait_for
from tests.browser.test_dashboard import assert_not_reloaded, mark_window
from tests.harness.worker_proc import Workers

pytestmark = pytest.mark.slow

ZOMBIE = "nightly-digest"
SUMMARY = """
const top = (css) => document.querySelector(css).getBoundingClientRect().top;
const done = document.getElementById('chart-done');
return {
  attention: Array.from(document.querySelectorAll('#attention tr.attention'),
    (tr) => tr.dataset.key),
  tiles: document.querySelector('#overview .tiles').innerText,
  doneTotal: done.getAttribute('data-total'),
  doneBars: done.querySelectorAll('rect.bar').length,
  doneHeight: done.getBoundingClientRect().height,
  overview: top('#overview'), attentionTop: top('#attention'), jobs: top('#jobs'),
};
"""
MEASURE = """
const svg = document.getElementById('timeline'), legend = document.getElementById('legend');
return {
  svg: svg.getBoundingClientRect().width,
  main: document.getElementById('job-live').getBoundingClientRect().width,
  legend: legend ? legend.innerText : '',
  legendShown: legend ? legend.getBoundingClientRect().height > 0 : false,
  calls: Array.from(svg.querySelectorAll('rect.call'), (r) => r.getBoundingClientRect().top),
};
"""
ATTENTION = "#attention tr.attention[data-key='{key}']"


async def until_status(url: str, key: str, status: Status, timeout: float = 30.0) -> None:
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout
        while (job := await store.get(key)) is None or job.status is not status:
            assert time.monotonic() < deadline, (key, job)
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()


async def test_the_jobs_page_leads_with_what_needs_attention(
    store_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """Over a taken-over, a cancelled, a failed, a zombie and a live worker's healthy job,
    the first page leads with the counts and the zombie and failed jobs (not the healthy
    one), then the charts (a job done this hour), then the table; a job failing after the
    page opened joins the list live, without a reload."""
    await finish(await run_takeover(store_url, "report-42", tmp_path / "takeover"))
    await cancelled(store_url, tmp_path / "cancelled")
    await fail_job(store_url, "render-7")
    (tmp_path / "zombie").mkdir()
    (tmp_path / "workers").mkdir()
    async with (
        await zombie(store_url, tmp_path / "zombie"),
        Workers(store_url, tmp_path / "workers") as workers,
    ):
        await workers.start_ready("worker-b1", concurrency=2, job_seconds=60)
        await submit(store_url, "embed-1")
        await until_status(store_url, "embed-1", Status.RUNNING)
        ui = start_ui(store_url)
        page.get(ui.url("/jobs"))
        mark_window(page)
        zombie_row = ATTENTION.format(key=ZOMBIE) + " .health-zombie"
        wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, zombie_row), "the zombie", 30)
        shown: dict[str, Any] = page.execute_script(SUMMARY)  # one go: live updates replace it
        attention = shown["attention"]
        assert ZOMBIE in attention and "render-7" in attention and "embed-1" not in attention
        for tile in ("FAILED 1", "CANCELLED 1", "zombie 1", "healthy 1", "DONE 1"):
            assert tile in shown["tiles"], shown["tiles"]
        assert shown["doneTotal"] == "1" and shown["doneBars"] >= 1 and shown["doneHeight"] > 0
        assert shown["overview"] < shown["attentionTop"] < shown["jobs"], shown
        await fail_job(store_url, "render-8")
        wait_for(
            page,
            lambda d: d.find_elements(By.CSS_SELECTOR, ATTENTION.format(key="render-8")),
            "the newly failed job in the attention list",
        )
        assert_not_reloaded(page)
        assert not console_errors(page)


async def test_the_workers_page_shows_running_health_and_throughput_live(
    store_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A live worker's running job shows with its health badge and stage; when it finishes
    the row drops it and counts it done, live, without a reload."""
    async with Workers(store_url, tmp_path) as workers:
        await workers.start_ready("worker-t", concurrency=1, until_finished=True)
        await submit(store_url, "first-job")
        await until_status(store_url, "first-job", Status.RUNNING)
        ui = start_ui(store_url)
        page.get(ui.url("/workers"))
        mark_window(page)
        row = "tr.worker[data-id='worker-t']"
        running = f"{row} span.running-job[data-key='first-job'] .health-healthy"
        wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, running), "the healthy job")
        workers.finish()  # only once it was seen running, however slowly the page came
        done = f"{row} td.throughput[data-done='1']"
        read = (
            "const row = document.querySelector(arguments[0]);"
            " return row ? [row.querySelectorAll('span.running-job').length,"
            " row.querySelector('td.throughput').innerText] : null"
        )
        wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, done), "one job done", 30)
        running_now, throughput = page.execute_script(read, row)  # one go: it is live
        assert running_now == 0 and "1 done · 0 failed" in throughput, throughput
        assert_not_reloaded(page)
        assert not console_errors(page)


async def test_the_timeline_is_full_width_with_a_legend_and_its_model_calls(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A taken-over job's timeline spans the page's width, its legend says what each mark
    means, and each model call is a bar on the lane of the owner that made it."""
    await finish(await run_takeover(sqlite_url, "report-42", tmp_path))
    ui = start_ui(sqlite_url)
    page.get(ui.url("/jobs/report-42"))
    wait_for(page, lambda d: d.find_elements(By.ID, "timeline"), "the timeline")
    # The live section is replaced when its stream's first state comes: read it in one go.
    shown: dict[str, Any] = page.execute_script(MEASURE)
    assert shown["svg"] >= 0.95 * shown["main"], shown
    assert shown["legend"] and shown["legendShown"], shown
    for meaning in ("(filled)", "(hollow)", "(diamond)", "(cross)", "model call"):
        assert meaning in shown["legend"], shown["legend"]
    calls = shown["calls"]
    assert len(calls) >= 2 and len(set(calls)) >= 2, calls  # A's call and B's, two lanes
    assert not console_errors(page)
