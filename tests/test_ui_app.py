"""The dashboard over real stores: real uvicorn on a loopback port, jobs made by real
Runner runs, httpx as the client (the browser tests are in tests/browser/)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from httpx_sse import aconnect_sse

from ai_lease.client import Client
from ai_lease.errors import AiLeaseError
from ai_lease.job import Job, Status
from ai_lease.lease import LeaseStore
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.testing.scripted import Pause, ScriptedProvider
from ai_lease.timeouts import LeaseTimings, StageBudget
from ai_lease.ui.app import CSP, create_app
from ai_lease.ui.views import OVERVIEW_EVERY_S

FAST = LeaseTimings(
    ttl=2.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(5, 60)},
)
XSS_KEY = "<script>alert(1)</script>"
XSS_ATTR = '"><img src=x onerror=alert(1)>'
TOKEN = "ui-test-token-1234"


@asynccontextmanager
async def serving(store: Any, apps: list[Any] | None = None, **options: Any) -> AsyncIterator[str]:
    """The app over ``store`` on a real uvicorn, on a free loopback port, in this loop
    (appended to ``apps`` when given, for a test that reaches into its state)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(Client(store), settings_view={"store": "sqlite:///x.db"}, **options)
    if apps is not None:
        apps.append(app)
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", ws="none", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), task
            await asyncio.sleep(0.01)  # real: real uvicorn on a loopback socket over real stores
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def runner(store: LeaseStore, provider: ScriptedProvider, node: str = "n1") -> Runner:
    return Runner(store, provider=provider, config=RunConfig(timings=FAST, node_id=node))


async def run_job(store: LeaseStore, key: str, text: str = "an answer") -> None:
    await runner(store, ScriptedProvider([text])).run(Job(key, input="x"))


async def until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)  # real: real uvicorn on a loopback socket over real stores


async def running(store: LeaseStore, key: str) -> bool:
    job = await store.get(key)
    return job is not None and job.status is Status.RUNNING


def csrf_of(page: str) -> str:
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


class Counting:
    """A real store, counting the reads the live pages make."""

    def __init__(self, store: LeaseStore) -> None:
        self._store, self.reads = store, 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name in ("list_page", "list_jobs", "get"):

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.reads += 1
                return await found(*args, **kwargs)

            return counted
        return found


# -- pages ------------------------------------------------------------------------------------


async def test_every_page_renders_for_real_jobs(store: LeaseStore) -> None:
    """/, /jobs, /jobs/KEY, /workers, a 404 and /healthz render for jobs real runs made."""
    for key in ("alpha", "beta"):
        await run_job(store, key, f"result of {key}")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        home = await client.get("/")
        assert home.status_code == 307 and home.headers["location"] == "/jobs"
        jobs = await client.get("/jobs")
        assert jobs.status_code == 200 and '<tbody id="jobs-body">' in jobs.text
        assert jobs.text.index('data-key="beta"') < jobs.text.index('data-key="alpha"')
        assert 'data-status="DONE"' in jobs.text and '<a href="/jobs/alpha">' in jobs.text
        one = await client.get("/jobs/alpha")
        assert one.status_code == 200 and '<h1 id="job-key">alpha</h1>' in one.text
        for part in ('<dl id="record">', '<section id="job-live">', '<svg id="timeline"'):
            assert part in one.text
        assert '<pre id="result">' in one.text and "result of alpha" in one.text
        assert '<pre id="result">result of alpha' in one.text  # a text result as text, no quotes
        assert 'action="/jobs/alpha/cancel"' in one.text and 'id="remove"' in one.text
        assert (await client.get("/workers")).status_code == 200
        assert '<table id="workers">' in (await client.get("/workers")).text
        assert (await client.get("/jobs/nope")).status_code == 404
        health = await client.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok")
        assert (await client.get("/static/ui.js")).status_code == 200


async def test_every_response_carries_the_security_headers(store: LeaseStore) -> None:
    """CSP, nosniff and no-referrer on pages, static files, errors and /metrics."""
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        for path in ("/jobs", "/static/ui.css", "/jobs/nope", "/metrics", "/healthz"):
            response = await client.get(path)
            assert response.headers["content-security-policy"] == CSP, path
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"


async def test_filters_and_pages(store: LeaseStore) -> None:
    """Status and prefix filters select; 120 jobs come 50 a page, newest first, no repeats."""
    await run_job(store, "done-1")
    for i in range(120):
        await store.submit(f"batch-{i:03d}", "{}", f"fp{i}")  # type: ignore[attr-defined]
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        done = (await client.get("/jobs", params={"status": "DONE"})).text
        assert done.count('<tr class="job"') == 1 and 'data-key="done-1"' in done
        seen: list[str] = []
        url: str | None = "/jobs?prefix=batch-"
        while url is not None:
            text = html.unescape((await client.get(url)).text)
            keys = [part.split('"')[0] for part in text.split('data-key="')[1:]]
            assert len(keys) <= 50
            seen += keys
            marker = '<a id="next-page" href="'
            url = text.split(marker)[1].split('"')[0] if marker in text else None
        assert seen == [f"batch-{i:03d}" for i in reversed(range(120))]
        healthy = (await client.get("/jobs", params={"health": "zombie"})).text
        assert '<tr class="job"' not in healthy


async def test_store_values_render_as_text(store: LeaseStore) -> None:
    """A key or result holding <script> or an attribute break-out renders escaped in the
    jobs page, the job page and the live rows."""
    for key in (XSS_KEY, XSS_ATTR):
        await run_job(store, key, f"{XSS_KEY} {XSS_ATTR}")
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        pages = [(await client.get("/jobs")).text]
        for key in (XSS_KEY, XSS_ATTR):
            pages.append((await client.get("/jobs/" + httpx.URL(key).raw_path.decode())).text)
        async with aconnect_sse(client, "GET", "/live/jobs") as source:
            async for event in source.aiter_sse():
                assert event.event == "rows"
                pages.append(event.data)
                break
    for text in pages:
        assert "<script>alert" not in text and "<img src=x" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in pages[0]
    assert 'href="/jobs/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in pages[0]


# -- security -----------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
    )


def test_a_public_bind_without_a_token_refuses_to_start(sqlite_url: str) -> None:
    """`ai-lease ui --host 0.0.0.0` without a token exits 2 with one line, binding nothing."""
    done = _cli("--store", sqlite_url, "ui", "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "--token" in line and "AI_LEASE_UI__TOKEN" in line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _make_store(url: str) -> None:
    store = open_store(url)
    try:
        await store.get("any")  # the first operation creates it
    finally:
        await store.aclose()


def test_the_command_serves_the_store_with_its_url_masked(tmp_path: Path) -> None:
    """`ai-lease ui` serves the jobs of the store it is given; a password in the store URL
    never reaches a page (it is shown as ***)."""
    url, port = f"sqlite:///{tmp_path / 'ui.db'}?password=hunter2", _free_port()
    asyncio.run(_make_store(url))  # the dashboard only looks: the store must be there
    base = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    args = [sys.executable, "-m", "ai_lease", "--store", url, "ui", "--port", str(port)]
    with subprocess.Popen(args, env=base, stderr=subprocess.PIPE, text=True) as server:
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    page = httpx.get(f"http://127.0.0.1:{port}/jobs", timeout=2)
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)  # real: real uvicorn on a loopback socket over real stores
            assert page.status_code == 200 and '<table id="jobs">' in page.text
            assert "hunter2" not in page.text and "password=***" in page.text
            assert "server" not in page.headers
        finally:
            server.terminate()
            _, err = server.communicate(timeout=20)
    assert "hunter2" not in err


def test_a_missing_extra_is_one_line_and_exit_2(sqlite_url: str) -> None:
    """Without starlette/uvicorn installed, `ai-lease ui` says how to get them (exit 2)."""
    code = (
        "import sys; sys.modules['uvicorn'] = None\n"
        "from ai_lease.cli.app import main\n"
        f"main(['--store', {sqlite_url!r}, 'ui'], prog_name='ai-lease')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "ai-lease: error: ai-lease ui needs the ui extra: pip install 'ai_lease[ui]'"
    ]


async def test_the_token_guards_every_page(sqlite_store: LeaseStore) -> None:
    """With a token: 401 without it (HTML with a /login link), 200 with the bearer or the
    login cookie (HttpOnly, SameSite=Strict); a wrong token is refused; /healthz is open."""
    await run_job(sqlite_store, "guarded")
    async with serving(sqlite_store, token=TOKEN) as base:
        async with httpx.AsyncClient(base_url=base) as anon:
            assert (await anon.get("/jobs")).status_code == 401
            assert (await anon.get("/metrics")).status_code == 401
            assert (await anon.get("/live/jobs")).status_code == 401
            page = await anon.get("/jobs/guarded", headers={"accept": "text/html"})
            assert page.status_code == 401 and 'href="/login"' in page.text
            assert (await anon.get("/healthz")).status_code == 200
            wrong = await anon.get("/jobs", headers={"authorization": "Bearer guess"})
            assert wrong.status_code == 401
            bad_login = await anon.post("/login", data={"token": "guess"})
            assert bad_login.status_code == 401
        bearer = {"authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=bearer) as client:
            assert (await client.get("/jobs")).status_code == 200
        async with httpx.AsyncClient(base_url=base) as browser:
            login = await browser.post("/login", data={"token": TOKEN})
            assert login.status_code == 303 and login.headers["location"] == "/jobs"
            cookie = login.headers["set-cookie"].lower()
            assert "httponly" in cookie and "samesite=strict" in cookie
            assert TOKEN not in login.headers["set-cookie"]
            assert (await browser.get("/jobs")).status_code == 200
            assert TOKEN not in (await browser.get("/jobs/guarded")).text


async def test_an_action_without_its_csrf_token_is_403(sqlite_store: LeaseStore) -> None:
    """A POST without the page's CSRF token (or with another's) is 403 and changes nothing."""
    await sqlite_store.submit("waiting", "{}", "fp")  # type: ignore[attr-defined]
    bearer = {"authorization": f"Bearer {TOKEN}"}
    async with (
        serving(sqlite_store, token=TOKEN) as base,
        httpx.AsyncClient(base_url=base, headers=bearer) as client,
    ):
        assert (await client.post("/jobs/waiting/cancel")).status_code == 403
        await client.get("/jobs/waiting")  # a session cookie, but no token sent
        forged = await client.post("/jobs/waiting/cancel", data={"csrf": "0" * 64})
        assert forged.status_code == 403
        assert (await client.get("/jobs/waiting/cancel")).status_code in (404, 405)  # GET: no act
    job = await sqlite_store.get("waiting")
    assert job is not None and job.status is Status.PENDING


# -- actions ----------------------------------------------------------------------------------


async def _post(client: httpx.AsyncClient, key: str, action: str, **data: str) -> httpx.Response:
    page = (await client.get(f"/jobs/{key}")).text
    return await client.post(f"/jobs/{key}/{action}", data={"csrf": csrf_of(page), **data})


async def test_cancel_from_the_page_stops_the_running_owner(store: LeaseStore) -> None:
    """Cancel on a running job's page: CANCELLED, and its owner (a real Runner) stops."""
    slow = ScriptedProvider([f"{i} " if i % 2 else Pause(0.2) for i in range(200)])
    owner = asyncio.create_task(runner(store, slow).run(Job("slow", input="x")))
    await until(lambda: running(store, "slow"))
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        done = await _post(client, "slow", "cancel")
        assert done.status_code == 303
        assert done.headers["location"] == "/jobs/slow?flash=cancelled&key=slow"
        shown = await client.get(done.headers["location"])
        assert 'id="flash"' in shown.text and "Cancelled" in shown.text
    with pytest.raises(AiLeaseError):
        await asyncio.wait_for(owner, 10)
    job = await store.get("slow")
    assert job is not None and job.status is Status.CANCELLED


async def test_remove_keeps_a_running_job_unless_forced_and_retry_reopens(
    store: LeaseStore,
) -> None:
    """Remove refuses a RUNNING job under a live lease, force removes it; retry sends a
    CANCELLED job back to PENDING — the CLI's rules."""
    slow = ScriptedProvider([Pause(0.2)] * 200)
    owner = asyncio.create_task(runner(store, slow).run(Job("busy", input="x")))
    await until(lambda: running(store, "busy"))
    await store.submit("later", "{}", "fp")  # type: ignore[attr-defined]
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        kept = await _post(client, "busy", "remove")
        assert kept.headers["location"].startswith("/jobs/busy?flash=kept")
        assert await running(store, "busy")
        gone = await _post(client, "busy", "remove", force="1")
        assert gone.headers["location"].startswith("/jobs?flash=removed")
        await _post(client, "later", "cancel")
        retried = await _post(client, "later", "retry")
        assert retried.headers["location"].startswith("/jobs/later?flash=retried")
    # Not awaited: a foreground Runner whose record was removed acquires the key afresh
    # (as after `ai-lease rm --force`); that rule is the store's, not the page's.
    owner.cancel()
    with contextlib.suppress(asyncio.CancelledError, AiLeaseError):
        await owner
    job = await store.get("later")
    assert job is not None and job.status is Status.PENDING


# -- live -------------------------------------------------------------------------------------


async def test_the_stream_sends_the_row_of_a_job_that_finished(store: LeaseStore) -> None:
    """/live/jobs sends the rows with the job RUNNING, then again once it is DONE."""
    slow = ScriptedProvider(["a", Pause(0.8), "b"])
    owner = asyncio.create_task(runner(store, slow).run(Job("live", input="x")))
    await until(lambda: running(store, "live"))
    statuses: list[str] = []
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        async with aconnect_sse(client, "GET", "/live/jobs") as source:
            async for event in source.aiter_sse():
                assert event.event == "rows" and 'data-key="live"' in event.data
                statuses.append("DONE" if 'data-status="DONE"' in event.data else "RUNNING")
                if statuses[-1] == "DONE":
                    break
    await owner
    assert statuses[0] == "RUNNING" and statuses[-1] == "DONE"


async def test_a_live_page_reads_the_store_once_per_interval(store: LeaseStore) -> None:
    """An open jobs stream reads the store once per refresh interval and sends nothing
    while nothing changes; a job page's stream likewise."""
    await run_job(store, "still")
    counting = Counting(store)
    async with serving(counting, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        for path, event_kind in (("/live/jobs", "rows"), ("/live/jobs/still", "job")):
            events: list[str] = []
            before, started = counting.reads, time.monotonic()

            async def listen(path: str = path, events: list[str] = events) -> None:
                async with aconnect_sse(client, "GET", path) as source:
                    async for event in source.aiter_sse():
                        events.append(event.event)

            listener = asyncio.create_task(listen())
            await asyncio.sleep(1.5)  # real: real uvicorn on a loopback socket over real stores
            listener.cancel()
            elapsed, reads = time.monotonic() - started, counting.reads - before
            assert events == [event_kind]  # the first state, then nothing: nothing changed
            # the jobs view also leads with the summary: its reads at most every 2 s
            summary = 4 * (elapsed / OVERVIEW_EVERY_S + 1) if event_kind == "rows" else 0
            assert 3 <= reads <= elapsed / 0.1 + 2 + summary, (reads, elapsed)


async def test_metrics_serve_the_registry_with_the_store_gauges(store: LeaseStore) -> None:
    """/metrics is Prometheus text of the metrics registry, with the store's gauges."""
    await run_job(store, "counted")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert "owner_takeover_total" in response.text


PAGE_BOUND_S = 5.0  # generous: one page is ~50 ms here, on a loaded 2-core machine


async def test_the_jobs_page_with_10000_jobs_renders_one_page(store: LeaseStore) -> None:
    """With 10,000 jobs in the store the jobs page renders one page of 50 rows within a
    generous bound, counts them all, and its Older link leads to the next 50 (its speed
    is measured in bench/ui_jobs.py)."""
    submit = store.submit  # type: ignore[attr-defined]
    # In batches: 10,000 calls at once would each start their op_timeout together, and on a
    # busy machine the last ones would time out waiting for a connection.
    for start in range(0, 10_000, 500):
        batch = range(start, start + 500)
        await asyncio.gather(*(submit(f"many-{i:05d}", "{}", "fp") for i in batch))
    await submit("many-newest", "{}", "fp")  # alone: the one surely newest
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        started = time.monotonic()
        page = await client.get("/jobs")
        elapsed = time.monotonic() - started
        keys = _row_keys(page.text)
        older = html.unescape(page.text.split('<a id="next-page" href="')[1].split('"')[0])
        second = await client.get(older)
        async with aconnect_sse(client, "GET", "/live/jobs") as source:
            live = await anext(aiter(source.aiter_sse()))
    # real: real uvicorn; the render time is what is bounded
    assert page.status_code == 200 and elapsed < PAGE_BOUND_S, elapsed
    older_keys = _row_keys(second.text)
    assert keys[0] == "many-newest" and len(set(keys)) == len(set(older_keys)) == 50
    assert not set(keys) & set(older_keys) and "PENDING 10001" in page.text
    assert _row_keys(live.data) == keys


def _row_keys(text: str) -> list[str]:
    return [part.split('"')[0] for part in text.split('<tr class="job" data-key="')[1:]]


async def test_a_running_job_is_healthy_and_its_page_goes_live_to_done(store: LeaseStore) -> None:
    """A running job shows under health=healthy (not zombie); its page's stream sends the
    live section again once it is DONE, with its result and its timeline."""
    slow = ScriptedProvider(["part one ", Pause(0.8), "part two"])
    owner = asyncio.create_task(runner(store, slow).run(Job("watched", input="x")))
    await until(lambda: running(store, "watched"))
    sections: list[str] = []
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        healthy = (await client.get("/jobs", params={"health": "healthy"})).text
        assert 'data-key="watched"' in healthy and "health-healthy" in healthy
        zombie = (await client.get("/jobs", params={"health": "zombie"})).text
        assert 'data-key="watched"' not in zombie
        async with aconnect_sse(client, "GET", "/live/jobs/watched") as source:
            async for event in source.aiter_sse():
                assert event.event == "job"
                sections.append(event.data)
                if "part two" in event.data:
                    break
    await owner
    assert "RUNNING" in sections[0] and '<svg id="timeline"' in sections[-1]
    assert "committed" in sections[-1] and '<pre id="result">' in sections[-1]
