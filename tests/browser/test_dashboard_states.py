"""Every dashboard page in Debian's headless Chromium, in the states a running system has.

The dashboard is the real ``python -m ai_lease ui`` child; a live worker is a real worker
process (``tests/harness/worker_proc.py``) streaming a job; ended and corrupt records are
made by store operations and planted rows (``tests/test_ui_states.py``). Each page is
checked by what it shows and by the browser console: no script error, no CSP violation,
no failed request.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from selenium.common.exceptions import NoSuchElementException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from ai_lease import open_store
from ai_lease.job import Job
from ai_lease.lease.queue import MAX_REPORTED_JOBS, WorkerInfo
from ai_lease.run.runner import Runner
from tests.browser.support import StartUI, click, console_errors, finish, run_takeover, wait_for
from tests.browser.test_dashboard import assert_not_reloaded, mark_window
from tests.harness.worker_proc import Workers
from tests.test_ui_states import (
    MANY,
    MANY_WORKER,
    MIXED,
    seed_10000_mixed,
    seed_ended_and_corrupt,
    take_over,
)

pytestmark = pytest.mark.slow

PAGE_BOUND_S = 10.0  # a page of 10,000 jobs renders in well under a second here


TEXT_JS = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;"


def text_of(page: WebDriver, css: str) -> str:
    """The text ``css`` shows, read in one script (a live update replacing the element in
    between cannot make it stale); NoSuchElementException if it is not there."""
    found = page.execute_script(TEXT_JS, css)
    if found is None:
        raise NoSuchElementException(css)
    return str(found).strip()


def visit(page: WebDriver, url: str, css: str, what: str) -> None:
    """Load ``url``, wait for ``css`` to be on it, and fail on any console error."""
    page.get(url)
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, css), what)
    errors = console_errors(page)
    assert not errors, (url, errors)


def visit_metrics(page: WebDriver, url: str, *lines: str) -> str:
    """Load /metrics (Prometheus text, which Chromium shows as a page), wait for the
    registry's ``owner_takeover_total`` and every one of ``lines`` in it, and fail on any
    console error. Returns the text."""
    page.get(url)

    def shown(d: WebDriver) -> str | None:
        text = text_of(d, "body")
        return text if "owner_takeover_total" in text and all(x in text for x in lines) else None

    text = wait_for(page, shown, f"the metrics with {lines}")
    errors = console_errors(page)
    assert not errors, (url, errors)
    return text


async def _reported(store_url: str, worker_id: str, key: str) -> bool:
    store = open_store(store_url)
    try:
        found = await store.list_workers()  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    return any(w.worker_id == worker_id and key in w.jobs for w in found)


async def test_a_live_worker_streaming_a_job_on_every_page(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A real worker streams a job: the workers page shows it with a link to the job (it
    was a 500), the link opens the RUNNING job, the jobs page shows it healthy, and
    /metrics serves text."""
    key = "browser-live"
    async with Workers(sqlite_url, tmp_path) as workers:
        await workers.start_ready("worker-b1", concurrency=2, job_seconds=60)
        store = open_store(sqlite_url)
        try:
            await Runner(store).submit(Job(key, input=key, prompt_text="{{ input }}"))
        finally:
            await store.aclose()
        deadline = time.monotonic() + 20
        while not await _reported(sqlite_url, "worker-b1", key):
            assert time.monotonic() < deadline, workers.dump()
            await asyncio.sleep(0.1)
        ui = start_ui(sqlite_url)
        visit(page, ui.url("/workers"), 'tr.worker[data-id="worker-b1"]', "the worker's row")
        row = 'tr.worker[data-id="worker-b1"]'
        assert text_of(page, f"{row} td.jobs") == "1/2"
        click(page, f'{row} td.keys a[href="/jobs/{key}"]', "the link to the worker's job")
        wait_for(page, lambda d: text_of(d, "#job-key") == key, "the job's page")
        assert "RUNNING" in text_of(page, "#record")
        assert not console_errors(page)
        visit(page, ui.url("/jobs"), f'tr.job[data-key="{key}"]', "the job's row")
        assert page.find_elements(By.CSS_SELECTOR, f'tr.job[data-key="{key}"] .health-healthy')
        page.get(ui.url("/metrics"))
        wait_for(page, lambda d: "owner_takeover_total" in text_of(d, "body"), "the metrics")


ROW_CELLS_JS = """
const tr = document.querySelector('#jobs-body tr.job[data-key="' + arguments[0] + '"]');
if (!tr) return null;
const cell = (name) => tr.querySelector('td.' + name).textContent.trim();
return {status: tr.dataset.status, owner: cell('owner'), token: cell('token'),
        takeovers: cell('takeovers')};
"""


async def test_a_job_being_taken_over_on_the_jobs_page(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A stalled owner's lease lapses and a follower acquires it with a higher token: the
    jobs page's row turns to the new owner, token and one takeover live, with no reload."""
    key = "being-taken"
    ui = start_ui(sqlite_url)
    cluster = await run_takeover(sqlite_url, key, tmp_path / "takeover")
    async with cluster:
        visit(page, ui.url("/jobs"), f'tr.job[data-key="{key}"]', "the owned job's row")
        before = page.execute_script(ROW_CELLS_JS, key)
        assert before["takeovers"] == "0" and before["status"] == "RUNNING", before
        mark_window(page)

        def taken(d: WebDriver) -> dict[str, str] | None:
            found = d.execute_script(ROW_CELLS_JS, key)
            return found if found and found["takeovers"] == "1" else None

        after = wait_for(page, taken, "the row to show the takeover, live")
        assert_not_reloaded(page)
        assert after["owner"] != before["owner"] and int(after["token"]) > int(before["token"])
        await finish(cluster)
    assert not console_errors(page)


async def test_ended_and_corrupt_records_on_every_page(
    sqlite_url: str, start_ui: StartUI, page: WebDriver
) -> None:
    """FAILED, CANCELLED and DONE jobs beside a corrupt record and corrupt worker entries:
    the jobs page lists them all, the corrupt one marked; its link opens a page saying what
    is wrong; the FAILED job shows its error; the workers page marks the bad entries beside
    the good worker; /metrics counts the FAILED and CANCELLED jobs."""
    store = open_store(sqlite_url)
    try:
        keys = await seed_ended_and_corrupt(store, sqlite_url)
    finally:
        await store.aclose()
    ui = start_ui(sqlite_url)
    visit(page, ui.url("/jobs"), 'tr.job[data-key="bad-job"]', "the corrupt row")
    statuses: dict[str, str] = page.execute_script(  # in one script: a live update may
        "return Object.fromEntries(Array.from("  # replace the rows between two calls
        "document.querySelectorAll('#jobs-body tr.job'),"
        " (tr) => [tr.dataset.key, tr.dataset.status]))"
    )
    assert statuses == {
        "good-done": "DONE",
        "good-failed": "FAILED",
        "good-cancelled": "CANCELLED",
        "bad-job": "CORRUPT",
    }, statuses
    click(page, 'tr.job[data-key="bad-job"] td.key a', "the corrupt row's link")
    wait_for(page, lambda d: text_of(d, "#error") == "Corrupt record", "the corrupt page")
    assert "bad-job" in text_of(page, "main")
    console_errors(page)  # the page is a 500, which the console reports: expected here
    for key in keys[:3]:
        visit(page, ui.url(f"/jobs/{key}"), "#record", f"{key}'s record")
    visit(page, ui.url("/jobs/good-failed"), "#record", "the FAILED job")
    assert "the model said no" in text_of(page, "#record")
    visit(page, ui.url("/workers"), 'tr.worker[data-id="good-worker"]', "the workers")
    for bad in ("bad-worker", "typed-worker"):
        assert "CORRUPT" in text_of(page, f'tr.worker.corrupt[data-id="{bad}"]')
    assert text_of(page, 'tr.worker[data-id="good-worker"] td.jobs') == "0/4"
    counts = ('jobs{status="FAILED"} 1.0', 'jobs{status="CANCELLED"} 1.0')
    visit_metrics(page, ui.url("/metrics"), *counts)


def test_an_empty_store_on_every_page(sqlite_url: str, start_ui: StartUI, page: WebDriver) -> None:
    """An empty store: the jobs and workers pages say there is nothing, /metrics serves
    text, an unknown job is the not-found page; no console error on the pages that are."""
    ui = start_ui(sqlite_url)
    visit(page, ui.url("/"), "#jobs-body tr.empty", "the empty jobs table")
    assert text_of(page, "#jobs-body") == "No jobs."
    visit(page, ui.url("/workers"), "#workers tr.empty", "the empty workers table")
    assert text_of(page, "#workers tbody") == "No live workers."
    page.get(ui.url("/metrics"))
    wait_for(page, lambda d: "owner_takeover_total" in text_of(d, "body"), "the metrics")
    page.get(ui.url("/jobs/nothing-here"))
    wait_for(page, lambda d: text_of(d, "#error") == "Not found", "the not-found page")


async def test_10000_jobs_page_by_page(sqlite_url: str, start_ui: StartUI, page: WebDriver) -> None:
    """10,000 jobs: the jobs page shows 50 within a generous bound, Older shows the next 50,
    Newest goes back to the first page."""
    store = open_store(sqlite_url)
    try:
        submit = store.submit  # type: ignore[attr-defined]
        for start in range(0, 10_000, 500):
            await asyncio.gather(
                *(submit(f"many-{i:05d}", "{}", "fp") for i in range(start, start + 500))
            )
    finally:
        await store.aclose()
    ui = start_ui(sqlite_url)
    started = time.monotonic()
    visit(page, ui.url("/jobs"), "#jobs-body tr.job", "the first page")
    assert time.monotonic() - started < PAGE_BOUND_S
    first = keys_shown(page)
    assert len(set(first)) == 50 and "PENDING 10000" in text_of(page, ".counts")
    click(page, "#next-page", "the next-page link")
    wait_for(page, lambda d: "after=" in d.current_url, "the next page")
    second = keys_shown(page)
    assert len(set(second)) == 50 and not set(first) & set(second)
    click(page, "#first-page", "the first-page link")
    wait_for(page, lambda d: keys_shown(d) == first, "the first page again")
    assert not console_errors(page)


async def test_a_job_taken_over_on_every_page(
    sqlite_url: str, start_ui: StartUI, page: WebDriver
) -> None:
    """A lease that lapsed and was acquired by worker-b with a higher token (worker-b live,
    reporting it), and one lapsed but not yet taken: the jobs page shows the new owner,
    token and one takeover; the job's page says the same and why (expired); the workers
    page links the taken job under worker-b; /metrics counts one live and one lapsed lease."""
    store = open_store(sqlite_url)
    try:
        token = (await take_over(store, "worker-a#1.a", "worker-b#1.b", ttl=300)).fence.token
        info = WorkerInfo("worker-b", "host", 1, 1, 2, time.time(), time.time(), ("taken",))
        await store.worker_beat(info, 300)  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    ui = start_ui(sqlite_url)
    visit(page, ui.url("/jobs"), 'tr.job[data-key="taken"]', "the taken job's row")
    taken = page.execute_script(ROW_CELLS_JS, "taken")
    assert (taken["status"], taken["token"], taken["takeovers"]) == ("RUNNING", str(token), "1")
    assert "worker-b" in taken["owner"], taken
    lapsed = page.execute_script(ROW_CELLS_JS, "lapsed")
    assert "worker-a" in lapsed["owner"] and lapsed["takeovers"] == "0", lapsed
    visit(page, ui.url("/jobs/taken"), "#record", "the taken job's record")
    assert text_of(page, "#job-key") == "taken"
    record = text_of(page, "#record")
    assert "worker-b#1.b" in record and str(token) in record and "expired" in record, record
    worker = 'tr.worker[data-id="worker-b"]'
    visit(page, ui.url("/workers"), f'{worker} span.running-job[data-key="taken"]', "worker-b")
    assert text_of(page, f"{worker} td.jobs") == "1/2"
    assert page.find_elements(By.CSS_SELECTOR, f'{worker} td.keys a[href="/jobs/taken"]')
    visit_metrics(page, ui.url("/metrics"), "leases_live 1.0", "leases_lapsed 1.0")


async def test_10000_mixed_jobs_on_every_page(
    sqlite_url: str, start_ui: StartUI, page: WebDriver
) -> None:
    """10,000 jobs, the newest 100 each DONE, FAILED, CANCELLED and RUNNING under a live
    worker: the jobs page counts every status within a generous bound; the page of a job of
    each status shows that status; the workers page shows the worker's running jobs (as
    many as it reports) and what it finished; /metrics counts the jobs by status."""
    store = open_store(sqlite_url)
    try:
        keys = await seed_10000_mixed(store)
    finally:
        await store.aclose()
    ui = start_ui(sqlite_url)
    started = time.monotonic()
    visit(page, ui.url("/jobs"), "main #jobs-body tr.job", "the first page")
    assert time.monotonic() - started < PAGE_BOUND_S
    counts = text_of(page, ".counts")
    assert f"PENDING {MANY - 4 * MIXED}" in counts, counts
    assert all(f"{status} {MIXED}" in counts for status in keys), counts
    assert len(set(keys_shown(page))) == 50
    for status, key in keys.items():
        started = time.monotonic()
        visit(page, ui.url(f"/jobs/{key}"), f'main #job-status[data-status="{status}"]', key)
        assert time.monotonic() - started < PAGE_BOUND_S
        record = text_of(page, "#record")
        assert text_of(page, "#job-key") == key and status in record, record
        assert status != "FAILED" or "the model said no" in record, record
    worker = f'tr.worker[data-id="{MANY_WORKER}"]'
    started = time.monotonic()
    visit(page, ui.url("/workers"), f"main {worker}", "the worker's row")
    assert time.monotonic() - started < PAGE_BOUND_S
    running = page.find_elements(By.CSS_SELECTOR, f"{worker} span.running-job")
    assert len(running) == MAX_REPORTED_JOBS
    assert page.find_elements(By.CSS_SELECTOR, f'{worker} a[href="/jobs/{keys["RUNNING"]}"]')
    assert text_of(page, f"{worker} td.throughput") == f"{MIXED} done · {MIXED} failed"
    lines = [f'jobs{{status="PENDING"}} {MANY - 4 * MIXED}.0']
    lines += [f'jobs{{status="{status}"}} {MIXED}.0' for status in keys]
    visit_metrics(page, ui.url("/metrics"), *lines)


async def test_page_after_page_each_loads_and_a_page_gone_back_to_is_live(
    sqlite_url: str, start_ui: StartUI, page: WebDriver
) -> None:
    """Eight job pages opened one after another in one tab all load (each page left stayed
    in the back/forward cache with its stream open, holding one of Chromium's six
    connections to the dashboard: the seventh never loaded), and the page gone back to
    gets live updates again."""
    store = open_store(sqlite_url)
    try:
        for i in range(8):
            await store.submit(f"walk-{i}", "{}", "fp")  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    ui = start_ui(sqlite_url)
    for i in range(8):
        visit(page, ui.url(f"/jobs/walk-{i}"), "#record", f"job page {i + 1} of 8")
        assert text_of(page, "#job-key") == f"walk-{i}"
    left_at = page.execute_script("return Date.now()")
    page.back()

    def live_again(d: WebDriver) -> bool:
        updated = d.execute_script("return document.body.getAttribute('data-updated')")
        return text_of(d, "#job-key") == "walk-6" and updated and int(updated) > left_at

    wait_for(page, live_again, "the page gone back to to be updated by its stream")
    assert not console_errors(page)


def keys_shown(page: WebDriver) -> list[str]:
    found: list[str] = page.execute_script(
        "return Array.from(document.querySelectorAll('#jobs-body tr.job'), (tr) => tr.dataset.key)"
    )
    return found
