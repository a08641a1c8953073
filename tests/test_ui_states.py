"""Every dashboard route over HTTP in each state a running system has, on every store.

The states are made by real parts on the real store: a real ``Worker`` running a streaming
job, a lease that lapsed and was taken over with a higher token, FAILED and CANCELLED
records, corrupt entries planted beside good ones (as ``tests/test_cli_corrupt.py`` does),
an empty store. ``visit_every_route`` requests every route the app serves (a test checks
that list against the app's own routes) and fails on any answer that is not a page.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from httpx_sse import aconnect_sse

from ai_lease import Acquired
from ai_lease.client import Client
from ai_lease.job import Job, Status
from ai_lease.lease import LeaseStore
from ai_lease.lease.queue import MAX_REPORTED_JOBS, WorkerInfo
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Pause, ScriptedProvider
from ai_lease.ui.app import create_app
from ai_lease.ui.listing import HEALTHS, STATUSES
from ai_lease.ui.present import job_url
from ai_lease.ui.render import Templates
from tests.test_cli_corrupt import plant_corrupt_job, plant_corrupt_result, plant_corrupt_worker
from tests.test_ui_app import csrf_of, runner, serving, until

# The route patterns visit_every_route requests (checked against the app's routes).
VISITED = {
    "/",
    "/jobs",
    "/live/jobs",
    "/live/jobs/{key:path}",
    "/jobs/{key:path}/cancel",
    "/jobs/{key:path}/retry",
    "/jobs/{key:path}/remove",
    "/jobs/{key:path}",
    "/workers",
    "/live/workers",
    "/login",
    "/metrics",
    "/healthz",
    "/static",
}
CONTAINER_METHODS = {
    name
    for kind in (dict, list, tuple, set, frozenset, str, bytes)
    for name in dir(kind)
    if not name.startswith("_")
}
SSE_WAIT_S = 15.0  # generous: the machine is loaded


async def first_event(client: httpx.AsyncClient, path: str) -> str:
    """The first SSE event's data on ``path``."""
    async with asyncio.timeout(SSE_WAIT_S), aconnect_sse(client, "GET", path) as source:
        assert source.response.status_code == 200, path
        async for event in source.aiter_sse():
            return event.data
    raise AssertionError(f"{path}: the stream ended without an event")


def assert_page(response: httpx.Response, status: int = 200) -> str:
    """A whole HTML page with ``status`` (never the bare 'Internal Server Error')."""
    where = f"{response.request.method} {response.request.url.path}"
    assert response.status_code == status, (where, response.status_code, response.text[:500])
    assert response.text.rstrip().endswith("</html>"), (where, response.text[-300:])
    return response.text


async def visit_every_route(
    client: httpx.AsyncClient, keys: list[str], corrupt: tuple[str, ...] = ()
) -> dict[str, str]:
    """GET every page (every status and health filter, every job in ``keys`` and its
    stream), the static files, /metrics, /healthz, /login; POST every action to a job that
    does not exist. Returns each HTML page by path. A key in ``corrupt`` answers the
    corrupt-record page (500, naming it) instead of its job page."""
    pages: dict[str, str] = {}
    home = await client.get("/")
    assert home.status_code == 307 and home.headers["location"] == "/jobs"
    queries = ["", *(f"?status={s}" for s in STATUSES), *(f"?health={h}" for h in HEALTHS)]
    for query in queries:
        pages["/jobs" + query] = assert_page(await client.get("/jobs" + query))
    for key in keys:
        path = job_url(key)
        status = 500 if key in corrupt else 200
        pages[path] = assert_page(await client.get(path), status)
        live = await first_event(client, path.replace("/jobs/", "/live/jobs/", 1))
        assert key not in corrupt or "not an ai_lease job record" in live, live
    await first_event(client, "/live/jobs")
    pages["/workers"] = assert_page(await client.get("/workers"))
    await first_event(client, "/live/workers")
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and "owner_takeover_total" in metrics.text
    assert (await client.get("/healthz")).text == "ok"
    login = await client.get("/login")  # no token: straight to the jobs
    assert login.status_code == 303 and login.headers["location"] == "/jobs"
    for name in ("ui.css", "ui.js"):
        assert (await client.get(f"/static/{name}")).status_code == 200
    assert_page(await client.get("/jobs/no-such-job"), 404)
    forms = [pages[job_url(k)] for k in keys if k not in corrupt]
    for action in ("cancel", "retry", "remove"):
        data = {"csrf": csrf_of(forms[0])} if forms else {}
        done = await client.post(f"/jobs/no-such-job/{action}", data=data)
        if not forms:  # no job page, so no form's token: refused, with its reason
            assert done.status_code == 403 and "CSRF" in done.text, action
        else:
            assert done.status_code == 303 and "flash=unknown" in done.headers["location"]
    return pages


def row_of(page: str, marker: str) -> str:
    """The table row whose opening tag holds ``marker``, as HTML."""
    start = page.index(marker)
    return page[start : page.index("</tr>", start)]


def jobs_row(page: str, key: str) -> str:
    """The jobs table's row of ``key``, as HTML."""
    return row_of(page, f'data-key="{key}"')


@contextlib.asynccontextmanager
async def client_of(store: LeaseStore) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        yield client


# -- the matrix ---------------------------------------------------------------------------------


def test_the_state_matrix_visits_every_route_the_app_serves() -> None:
    """Every route of the app is in the list visit_every_route requests (a new route
    without a visit fails here)."""
    app = create_app(Client(object()))
    assert {route.path for route in app.routes} == VISITED


def test_no_template_reads_a_container_method_as_a_field() -> None:
    """No template reads ``x.keys``, ``x.items``, ``x.count``… (a dict's or list's method
    shadows the field: ``w.keys`` made the workers page a 500 with a live worker)."""
    from jinja2 import nodes

    env = Templates().env
    clashes = []
    for name in env.list_templates():
        source = env.loader.get_source(env, name)[0]  # type: ignore[union-attr]
        for node in env.parse(source).find_all(nodes.Getattr):
            if node.attr in CONTAINER_METHODS:
                clashes.append(f"{name}:{node.lineno}: .{node.attr}")
    assert not clashes, clashes


def test_a_dict_field_named_like_a_method_reads_the_field() -> None:
    """In the dashboard's templates ``d.keys`` of a dict is its item ``keys``, never the
    method; a list's ``.count`` is an error, never the method."""
    env = Templates().env
    shown = env.from_string("{% for k in w.keys %}{{ k }};{% endfor %}").render(
        w={"keys": ["a", "b"]}
    )
    assert shown == "a;b;"
    with pytest.raises(Exception, match="count"):
        env.from_string("{{ xs.count }}").render(xs=[1, 2])


async def test_every_page_in_an_empty_store(store: LeaseStore) -> None:
    """An empty store: every route answers a page; the tables say there is nothing."""
    async with client_of(store) as client:
        pages = await visit_every_route(client, [])
    assert "No jobs." in pages["/jobs"] and "No live workers." in pages["/workers"]


async def test_every_page_with_a_live_worker_running_a_streaming_job(store: LeaseStore) -> None:
    """A real Worker streams a job: the workers page lists it with a link to the job (it
    was a 500), the job is RUNNING and healthy on every page."""
    slow = ScriptedProvider([f"{i} " if i % 2 else Pause(0.1) for i in range(600)])
    run = runner(store, slow, node="node-live")
    await run.submit(Job("streaming", input="x", prompt_text="{{ input }}"))
    worker = Worker(store, run, concurrency=2, sweep_interval=0.1, worker_id="worker-live")
    async with worker:
        await until(lambda: _running(store, "streaming"), timeout=20)
        await until(lambda: _reports(store, "worker-live", "streaming"), timeout=20)
        async with client_of(store) as client:
            pages = await visit_every_route(client, ["streaming"])
        worker.kill()
    shown = pages["/workers"]
    row = row_of(shown, 'data-id="worker-live"')
    assert '<a href="/jobs/streaming">streaming</a>' in row and "No live workers" not in shown
    assert 'data-status="RUNNING"' in jobs_row(pages["/jobs"], "streaming")
    assert "health-healthy" in jobs_row(pages["/jobs?health=healthy"], "streaming")


async def _running(store: LeaseStore, key: str) -> bool:
    job = await store.get(key)
    return job is not None and job.status is Status.RUNNING and job.progress_version > 0


async def _reports(store: LeaseStore, worker_id: str, key: str) -> bool:
    found = await store.list_workers()  # type: ignore[attr-defined]
    return any(w.worker_id == worker_id and key in w.jobs for w in found)


async def take_over(store: LeaseStore, old: str, new: str, ttl: float) -> Acquired:
    """``taken`` and ``lapsed`` acquired by ``old`` with a 0.5 s lease that lapses (store
    clock); ``taken`` then acquired by ``new`` (lease ``ttl``) as a takeover with a higher
    token; ``lapsed`` left lapsed. Returns the new owner's acquisition."""
    first = await store.acquire("taken", old, ttl=0.5, max_no_progress=5)
    await store.acquire("lapsed", old, ttl=0.5, max_no_progress=5)
    assert isinstance(first, Acquired)
    # real: the leases lapse on the store's own clock
    await asyncio.sleep(1.0)  # both leases lapse (store clock)
    second = await store.acquire("taken", new, ttl=ttl, max_no_progress=ttl)
    assert isinstance(second, Acquired) and second.takeover
    assert second.fence.token > first.fence.token
    return second


async def test_every_page_while_a_job_is_taken_over(store: LeaseStore) -> None:
    """A lease that lapsed and was acquired by another owner with a higher token, and one
    lapsed but not yet taken: every page renders; the rows show the new owner and token."""
    second = await take_over(store, "owner-a", "owner-b", ttl=30)
    async with client_of(store) as client:
        pages = await visit_every_route(client, ["taken", "lapsed"])
    row = jobs_row(pages["/jobs"], "taken")
    assert "owner-b" in row and f'<td class="token">{second.fence.token}</td>' in row
    assert '<td class="takeovers">1</td>' in row
    assert "owner-a" in jobs_row(pages["/jobs"], "lapsed")


async def seed_ended_and_corrupt(store: LeaseStore, store_url: str) -> list[str]:
    """DONE (its result then made corrupt), FAILED and CANCELLED jobs, a corrupt job record
    ``bad-job``, a live ``good-worker`` and corrupt ``bad-worker``/``typed-worker`` entries.
    Returns the job keys."""
    done = await store.acquire("good-done", "node-a", ttl=30, max_no_progress=5)
    failing = await store.acquire("good-failed", "node-a", ttl=30, max_no_progress=5)
    assert isinstance(done, Acquired) and isinstance(failing, Acquired)
    await store.commit(done.fence, '"the summary"')
    await store.fail(failing.fence, "ProviderFailed: the model said no")
    await store.submit("good-cancelled", "{}", "fp")  # type: ignore[attr-defined]
    await store.cancel("good-cancelled", "cancelled by a test")
    info = WorkerInfo("good-worker", "host", 1, 0, 4, time.time(), time.time())
    await store.worker_beat(info, 30)  # type: ignore[attr-defined]
    plant_corrupt_job(store_url)
    plant_corrupt_result(store_url, "good-done")
    plant_corrupt_worker(store_url)
    return ["good-done", "good-failed", "good-cancelled", "bad-job"]


async def test_every_page_with_failed_cancelled_and_corrupt_records(
    store: LeaseStore, store_url: str
) -> None:
    """FAILED, CANCELLED and DONE records beside a corrupt record, a corrupt result and
    corrupt worker entries: every page renders; the corrupt ones are marked with their key
    (the jobs table row, the workers row), the corrupt job's page says what is wrong."""
    keys = await seed_ended_and_corrupt(store, store_url)
    async with client_of(store) as client:
        pages = await visit_every_route(client, keys, corrupt=("bad-job",))
    listed = pages["/jobs"]
    if not store_url.startswith("redis"):  # Redis pages its index, which the plant is not in
        assert 'data-status="CORRUPT"' in jobs_row(listed, "bad-job")
    assert 'data-status="FAILED"' in jobs_row(listed, "good-failed")
    assert 'data-status="CANCELLED"' in jobs_row(listed, "good-cancelled")
    assert "the model said no" in pages["/jobs/good-failed"]
    assert "Corrupt record" in pages["/jobs/bad-job"] and "bad-job" in pages["/jobs/bad-job"]
    workers = pages["/workers"]
    assert 'data-id="good-worker"' in workers
    for bad in ("bad-worker", "typed-worker"):
        assert "CORRUPT" in row_of(workers, f'data-id="{bad}"')


MANY = 10_000
MIXED = 100  # jobs of each status but PENDING among the 10,000
MANY_WORKER = "worker-10k"


async def seed_10000_mixed(store: LeaseStore) -> dict[str, str]:
    """10,000 submitted jobs ``many-00000``…, the newest ``MIXED`` each then made DONE,
    FAILED, CANCELLED and RUNNING by store operations (owned by ``MANY_WORKER``'s node), and
    the live ``MANY_WORKER`` reporting the first of its running ones. Returns one key per
    status but PENDING."""
    submit = store.submit  # type: ignore[attr-defined]
    # In batches: 10,000 calls at once would each start their op_timeout together.
    for start in range(0, MANY, 500):
        await asyncio.gather(
            *(submit(f"many-{i:05d}", "{}", "fp") for i in range(start, start + 500))
        )
    owner = f"{MANY_WORKER}#1.seed"
    done, failed, cancelled, running = (
        [f"many-{i:05d}" for i in range(MANY - (n + 1) * MIXED, MANY - n * MIXED)] for n in range(4)
    )

    async def end(key: str, how: str) -> None:
        got = await store.acquire(key, owner, ttl=300, max_no_progress=300)
        assert isinstance(got, Acquired), (key, got)
        if how == "done":
            await store.commit(got.fence, '"the summary"')
        elif how == "failed":
            await store.fail(got.fence, "ProviderFailed: the model said no")

    await asyncio.gather(*(end(k, "done") for k in done), *(end(k, "failed") for k in failed))
    await asyncio.gather(*(end(k, "running") for k in running))
    await asyncio.gather(*(store.cancel(k, "cancelled by a test") for k in cancelled))
    now = time.time()
    reported = tuple(running[:MAX_REPORTED_JOBS])
    info = WorkerInfo(MANY_WORKER, "host", 1, len(running), MIXED, now, now, reported)
    await store.worker_beat(info, 300)  # type: ignore[attr-defined]
    return {"DONE": done[0], "FAILED": failed[0], "CANCELLED": cancelled[0], "RUNNING": running[0]}


async def test_every_page_with_10000_mixed_jobs(store: LeaseStore) -> None:
    """10,000 jobs, some DONE, FAILED, CANCELLED and RUNNING: the jobs page counts each
    status, a job page of each status renders it, the workers page shows the worker's
    running jobs and what it finished, /metrics counts the jobs by status."""
    keys = await seed_10000_mixed(store)
    async with client_of(store) as client:
        jobs = assert_page(await client.get("/jobs"))
        shown = {s: assert_page(await client.get(job_url(k))) for s, k in keys.items()}
        workers = assert_page(await client.get("/workers"))
        metrics = await client.get("/metrics")
    counts = f"PENDING {MANY - 4 * MIXED}"
    assert counts in jobs and all(f"{s} {MIXED}" in jobs for s in keys), jobs[:3000]
    for status, page in shown.items():
        assert f'data-status="{status}"' in page, (status, page[:3000])
    assert "the model said no" in shown["FAILED"]
    row = row_of(workers, f'data-id="{MANY_WORKER}"')
    assert f'<a href="/jobs/{keys["RUNNING"]}">' in row, row
    assert row.count('class="running-job"') == MAX_REPORTED_JOBS, row
    assert f'data-done="{MIXED}" data-failed="{MIXED}"' in row, row
    assert metrics.status_code == 200 and "owner_takeover_total" in metrics.text
    if not store.__class__.__name__.startswith("Redis"):  # Redis keeps no count by status
        assert f'status="DONE"}} {MIXED}' in metrics.text, metrics.text[:3000]
