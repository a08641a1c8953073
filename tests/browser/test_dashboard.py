"""`ai-lease ui` in a real browser (Debian's headless Chromium), against jobs made by real runs.

Every job here comes from real node processes (``tests/harness/node.py``: a Runner on the
real store) and every page from the real ``python -m ai_lease ui`` child process
(``tests/harness/ui_server.py``). Live updates are told apart from reloads by a marker set
on ``window``: a reload would wipe it. The DOM names are the UI contract's (issue 16).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from ai_lease import Status, open_store
from tests.browser.support import (
    WAIT_S,
    StartUI,
    click,
    finish,
    run_ok,
    run_takeover,
    start_slow,
    wait_for,
)
from tests.harness.history import of_kind, read_record
from tests.harness.redis_server import free_port
from tests.harness.ui_server import STOP_TIMEOUT_S, run_ui

pytestmark = pytest.mark.slow

MARKER = "set before, so a reload would have wiped it"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
TOKEN = "ui-test-token-6f1d"

# The row of one job, found by its data-key (no CSS escaping of hostile keys needed).
ROW_JS = """
for (const tr of document.querySelectorAll('#jobs-body tr.job')) {
  if (tr.dataset.key !== arguments[0]) continue;
  const cell = (name) => tr.querySelector('td.' + name);
  const link = tr.querySelector('td.key a');
  const badge = tr.querySelector('td.health .badge');
  const status = cell('status');
  return {status: tr.dataset.status, text: status ? status.textContent.trim() : null,
          keyText: link ? link.textContent : null, href: link ? link.getAttribute('href') : null,
          badge: badge ? badge.className : null};
}
return null;
"""


def row(driver: WebDriver, key: str) -> dict[str, Any] | None:
    """The jobs-page row of ``key`` (status, texts, href, health badge) or None."""
    found: dict[str, Any] | None = driver.execute_script(ROW_JS, key)
    return found


def wait_row(driver: WebDriver, key: str, what: str, status: str | None = None) -> dict[str, Any]:
    """Wait until the row of ``key`` is on the page (with data-status ``status``, if given)."""

    def ready(d: WebDriver) -> dict[str, Any] | None:
        found = row(d, key)
        return found if found and status in (None, found["status"]) else None

    found = wait_for(driver, ready, what)
    assert found is not None
    return found


def row_keys(driver: WebDriver) -> list[str]:
    """The data-key of each jobs-page row, in order, read in one script: a live update may
    replace the rows between two WebDriver calls (a stale element, seen on a loaded machine)."""
    keys: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#jobs-body tr.job'), (tr) => tr.dataset.key)"
    )
    return keys


def mark_window(driver: WebDriver) -> None:
    driver.execute_script("window.__aiLeaseMarker = arguments[0]", MARKER)


def assert_not_reloaded(driver: WebDriver) -> None:
    assert driver.execute_script("return window.__aiLeaseMarker") == MARKER, "the page reloaded"


def lanes(driver: WebDriver) -> list[str]:
    """The data-owner of each lane of the job page's timeline, in order (read in one script:
    a live update may replace the SVG between two WebDriver calls)."""
    found: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg#timeline g.lane'),"
        " (g) => g.getAttribute('data-owner'))"
    )
    return found


def marks(driver: WebDriver, kind: str) -> list[dict[str, str]]:
    """The marks of ``kind`` on the timeline: their data-seq and data-token."""
    found: list[dict[str, str]] = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg#timeline g.mark.mark-' + arguments[0]),"
        " (g) => ({seq: g.getAttribute('data-seq'), token: g.getAttribute('data-token')}))",
        kind,
    )
    return found


# -- the jobs page ----------------------------------------------------------------------------


async def test_jobs_page_lists_real_runs_and_updates_live(
    store_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """The jobs page lists real runs newest first; a running job's row turns DONE when it
    finishes, with no reload; the filter form narrows the list."""
    await run_ok(store_url, "done-1", tmp_path / "done-1")
    await run_ok(store_url, "done-2", tmp_path / "done-2")
    ui = start_ui(store_url)
    cluster, owner = await start_slow(store_url, "live-1", tmp_path / "live-1", seconds=6)
    async with cluster:
        page.get(ui.url("/"))
        assert page.current_url == ui.url("/jobs"), "/ does not lead to /jobs"
        running = wait_row(page, "live-1", "the running job's row")
        assert running["status"] == "RUNNING" and "RUNNING" in running["text"], running
        assert "health-healthy" in running["badge"].split(), running
        assert row_keys(page) == ["live-1", "done-2", "done-1"]
        assert all(wait_row(page, k, k, "DONE") for k in ("done-1", "done-2"))
        mark_window(page)
        done = wait_row(page, "live-1", "live-1's row to turn DONE without a reload", "DONE")
        assert "DONE" in done["text"], done
        assert_not_reloaded(page)
        assert await owner.exited() == 0
    assert_filters(page)


def assert_filters(page: WebDriver) -> None:
    """The filter form: status DONE and prefix ``done-`` leave the two finished runs."""
    form = page.find_element(By.ID, "filters")
    page.execute_script("arguments[0].elements.status.value = 'DONE'", form)
    prefix = form.find_element(By.NAME, "prefix")
    prefix.clear()
    prefix.send_keys("done-")
    prefix.submit()
    wait_for(page, lambda d: "prefix=done-" in d.current_url, "the filtered page")
    wait_for(page, lambda d: row_keys(d) == ["done-2", "done-1"], "only done-2 and done-1")
    assert "status=DONE" in page.current_url


# -- a job's page: the timeline ---------------------------------------------------------------


async def test_taken_over_job_shows_two_lanes_and_the_rejected_write(
    store_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A job whose stalled owner was taken over: its page's timeline grows live to two lanes
    (A then B) with the rejected late write, and draws every timeline entry as a mark."""
    key = "taken-over"
    ui = start_ui(store_url)
    cluster = await run_takeover(store_url, key, tmp_path / "takeover", go=False)
    async with cluster:
        page.get(ui.url(f"/jobs/{key}"))
        wait_for(page, lambda d: lanes(d), "the first owner's lane")
        assert not marks(page, "fenced_write_rejected"), "the late write came before the page"
        mark_window(page)
        cluster.go()  # B follows only now: however slowly the page came, it sees the takeover
        wait_for(
            page,
            lambda d: len(lanes(d)) == 2 and marks(d, "fenced_write_rejected"),
            "two lanes and the rejected write, live",
        )
        assert_not_reloaded(page)
        await finish(cluster)
    histories = cluster.histories()
    a_owner = of_kind(histories["A"], "acquired")[0]
    b_owner = of_kind(histories["B"], "acquired")[0]
    page.refresh()
    wait_for(page, lambda d: d.find_elements(By.ID, "timeline"), "the timeline")
    assert lanes(page) == [a_owner["owner_id"], b_owner["owner_id"]]
    rejected = marks(page, "fenced_write_rejected")
    assert [m["token"] for m in rejected] == [str(a_owner["token"])], rejected
    assert page.find_elements(By.CSS_SELECTOR, "svg#timeline line.lease-expiry")
    await assert_every_entry_drawn(page, store_url, key)


async def assert_every_entry_drawn(page: WebDriver, store_url: str, key: str) -> None:
    """Each entry of the store's timeline for ``key`` is one mark of its kind and seq."""
    store = open_store(store_url)
    try:
        entries, dropped = await store.timeline(key)  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    assert dropped == 0 and entries
    drawn = {(m["seq"], kind) for kind in {e.kind for e in entries} for m in marks(page, kind)}
    assert drawn == {(str(e.seq), e.kind) for e in entries}


# -- actions ----------------------------------------------------------------------------------


async def test_cancel_from_the_page_stops_the_running_owner(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """Clicking #cancel on a running job's page cancels it; its owner process stops."""
    key = "to-cancel"
    ui = start_ui(sqlite_url)
    cluster, owner = await start_slow(sqlite_url, key, tmp_path / "cancel", seconds=60)
    async with cluster:
        page.get(ui.url(f"/jobs/{key}"))
        wait_for(page, lambda d: d.find_element(By.ID, "cancel").is_enabled(), "the cancel button")
        click(page, "#cancel", "the cancel button")
        accept_confirmation(page)
        await owner.exited(timeout=WAIT_S)
        exit_line = owner.events("exit")[-1]
        assert str(exit_line["error"]).startswith("JobCancelled"), exit_line
    record = await read_record(sqlite_url, key)
    assert record is not None and record.status is Status.CANCELLED
    page.get(ui.url(f"/jobs/{key}"))
    wait_for(page, lambda d: "CANCELLED" in d.find_element(By.ID, "record").text, "CANCELLED")


async def test_a_job_page_offers_only_the_actions_its_status_allows(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """A running job's page offers Cancel and Remove, not Retry; when the job finishes
    (live, no reload) Cancel is no longer offered; the page has its favicon."""
    key = "short-run"
    ui = start_ui(sqlite_url)
    cluster, _ = await start_slow(sqlite_url, key, tmp_path / "short", seconds=3)
    async with cluster:
        page.get(ui.url(f"/jobs/{key}"))
        mark_window(page)
        shown = lambda d: {b: d.find_element(By.ID, b).is_displayed() for b in ACTION_IDS}  # noqa: E731
        assert shown(page) == {"cancel": True, "retry": False, "remove": True}
        await finish(cluster)
        wait_for(
            page,
            lambda d: shown(d) == {"cancel": False, "retry": False, "remove": True},
            "Cancel withdrawn once the job is DONE",
        )
        assert_not_reloaded(page)
    icon = page.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    assert icon is not None
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(icon)).status_code == 200


ACTION_IDS = ("cancel", "retry", "remove")


def accept_confirmation(page: WebDriver) -> None:
    """Accept a confirm() dialog if the page asks one (the contract does not require it)."""
    try:
        WebDriverWait(page, 1.0).until(EC.alert_is_present()).accept()
    except TimeoutException:
        pass


# -- security ---------------------------------------------------------------------------------

XSS_IMG = "<img src=x onerror=window.__xss=1>"
XSS_SCRIPT = "<script>window.__xss=2</script>"
XSS_OWNER = "<img src=x onerror=window.__xss=3>"


def assert_no_injection(page: WebDriver) -> None:
    assert page.execute_script("return typeof window.__xss") == "undefined"
    injected = page.execute_script(
        "return document.querySelectorAll('img[src=\"x\"], body script:not([src])').length"
    )
    assert injected == 0, "a store value became an element"


async def test_hostile_keys_owner_and_result_render_as_text(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """Job keys, an owner and a result made of HTML render as text, server-side and in the
    live rows; no script runs."""
    await run_ok(sqlite_url, XSS_SCRIPT, tmp_path / "xss-script")
    ui = start_ui(sqlite_url)
    page.get(ui.url("/jobs"))
    first = wait_row(page, XSS_SCRIPT, "the <script> key's row")
    assert first["keyText"] == XSS_SCRIPT
    mark_window(page)
    await run_ok(sqlite_url, XSS_IMG, tmp_path / "xss-img", node=XSS_OWNER)  # arrives live
    second = wait_row(page, XSS_IMG, "the <img> key's row, live")
    assert_not_reloaded(page)
    assert second["keyText"] == XSS_IMG
    assert unquote(second["href"]) == f"/jobs/{XSS_IMG}" and "<" not in second["href"]
    # By now an injected <img src=x> would have failed to load and run its onerror.
    await asyncio.sleep(0.5)
    assert_no_injection(page)
    click(page, "#jobs-body tr.job td.key a", "the newest row's link")  # newest: XSS_IMG
    title = wait_for(page, lambda d: d.find_elements(By.ID, "job-key"), "the job page")[0]
    assert title.text == XSS_IMG
    assert f"answer from {XSS_OWNER}" in page.find_element(By.ID, "result").text
    labels = page.find_elements(By.CSS_SELECTOR, "svg#timeline g.lane text.lane-label")
    assert labels and labels[0].text.startswith("<img src=x")  # a long owner is shortened
    assert lanes(page)[0].startswith(XSS_OWNER)
    await asyncio.sleep(0.5)
    assert_no_injection(page)
    page.back()  # the other key's link: its "/" stays inside the one path segment

    # The page comes back from the back/forward cache and its stream opens again, whose
    # first update replaces the rows: a row found before it is stale, so find and click again.
    def click_last(d: WebDriver) -> bool:
        links = d.find_elements(By.CSS_SELECTOR, "td.key a")
        if links:
            links[-1].click()
        return bool(links)

    wait_for(page, click_last, "the rows")
    wait_for(page, lambda d: d.find_element(By.ID, "job-key").text == XSS_SCRIPT, "its page")
    assert_no_injection(page)


def test_non_loopback_bind_without_a_token_refuses_to_start(
    sqlite_url: str, tmp_path: Path
) -> None:
    """`ai-lease ui --host 0.0.0.0` without a token exits 2 with one line naming the token."""
    done = run_ui(sqlite_url, tmp_path, "--host", "0.0.0.0", "--port", str(free_port()))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and "token" in lines[0].lower(), done.stderr


async def test_with_a_token_a_request_needs_it_and_the_login_form_lets_the_browser_in(
    sqlite_url: str, start_ui: StartUI, page: WebDriver, tmp_path: Path
) -> None:
    """With --token: no token (or a wrong one) gets 401 on every page, /healthz stays open;
    the login form sets an HttpOnly SameSite=Strict cookie and the jobs page shows."""
    await run_ok(sqlite_url, "behind-login", tmp_path / "job")
    ui = start_ui(sqlite_url, token=TOKEN)
    await assert_token_required(ui.base_url)
    page.get(ui.url("/jobs"))
    wait_for(page, lambda d: d.find_elements(By.CSS_SELECTOR, "a[href^='/login']"), "a login link")
    assert not page.find_elements(By.ID, "jobs")
    click(page, "a[href^='/login']", "the login link")
    field = wait_for(
        page,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#login input[name=token]"),
        "the login form",
    )[0]
    field.send_keys(TOKEN)
    field.submit()
    wait_row(page, "behind-login", "the jobs page after login")
    assert page.current_url.startswith(ui.url("/jobs"))
    assert TOKEN not in page.page_source
    session = [c for c in page.get_cookies() if c.get("httpOnly")]
    assert session and all(c.get("sameSite") == "Strict" for c in session), page.get_cookies()


async def assert_token_required(base_url: str) -> None:
    """Every page and the live stream answer 401 without the token or with a wrong one
    (with the CSP header); /healthz answers without; the bearer token opens /jobs."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        for path in ("/jobs", "/jobs/behind-login", "/workers", "/metrics"):
            denied = await http.get(path)
            assert denied.status_code == 401, (path, denied.status_code)
            assert denied.headers.get("content-security-policy") == CSP
            wrong = await http.get(path, headers={"Authorization": "Bearer not-the-token"})
            assert wrong.status_code == 401, (path, wrong.status_code)
        async with http.stream("GET", "/live/jobs") as stream:
            assert stream.status_code == 401
        assert (await http.get("/healthz")).status_code == 200
        allowed = await http.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert allowed.status_code == 200 and "behind-login" in allowed.text
        assert allowed.headers.get("content-security-policy") == CSP


def test_ctrl_c_stops_the_server_with_a_live_page_open(
    sqlite_url: str, start_ui: StartUI, page: WebDriver
) -> None:
    """SIGINT stops `ai-lease ui` in time even while a page holds its live stream open."""
    ui = start_ui(sqlite_url)
    page.get(ui.url("/jobs"))
    wait_for(page, lambda d: d.find_elements(By.ID, "jobs"), "the jobs table")
    time.sleep(1.0)  # the page's EventSource is connected
    started = time.monotonic()
    ui.stop()
    assert not ui.killed, f"still running {STOP_TIMEOUT_S:g}s after SIGINT\n{ui.tail()}"
    assert time.monotonic() - started < STOP_TIMEOUT_S
