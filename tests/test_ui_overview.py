"""The jobs page's summary and the workers page's health and throughput, over HTTP on
every store (SQLite, Redis, PostgreSQL): what they show and how much they read.

Records are made by store operations (acquire, commit, fail, cancel, submit, worker
beats); the dashboard is the real app over loopback (tests/test_ui_app.py's ``serving``).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from ai_lease.job import JobState, Status
from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired
from ai_lease.lease.queue import WorkerInfo
from ai_lease.ui.overview import RUNNING_READ, per_minute, queue_depth
from tests.test_ui_app import serving
from tests.test_ui_states import row_of


def section(page: str, element_id: str) -> str:
    """The HTML of the element with ``element_id`` (up to its table's or section's end)."""
    start = page.index(f'id="{element_id}"')
    ends = [page.find(end, start) for end in ("</table>", "</svg>", "</section>")]
    return page[start : min(e for e in ends if e >= 0)]


def chart_total(page: str, chart: str) -> int:
    found = re.search(rf'<svg id="{chart}"[^>]* data-total="(\d+)"', page)
    assert found is not None, chart
    return int(found.group(1))


async def acquired(store: LeaseStore, key: str, owner: str, **lease: Any) -> Any:
    got = await store.acquire(key, owner, **{"ttl": 30.0, "max_no_progress": 5.0, **lease})
    assert isinstance(got, Acquired), got
    return got.fence


async def seed_needing_attention(store: LeaseStore) -> None:
    """A zombie (renewing, no progress), a dead owner (lapsed, no progress), a healthy
    one, a failed, a done and a cancelled job, and then 60 newer PENDING jobs on top."""
    await acquired(store, "zombie-1", "node-z#1.aa", max_no_progress=0.2)
    await acquired(store, "dead-1", "node-d#1.aa", ttl=0.3, max_no_progress=0.2)
    await acquired(store, "healthy-1", "node-h#1.aa")
    await store.fail(await acquired(store, "failed-1", "node-f#1.aa"), "ProviderFailed: no")
    await store.commit(await acquired(store, "done-1", "node-f#2.aa"), '"ok"')
    await store.submit("cancelled-1", "{}", "fp")  # type: ignore[attr-defined]
    await store.cancel("cancelled-1", "not needed")
    # real: progress goes stale on the store's own clock, read over HTTP
    await asyncio.sleep(0.6)  # the zombie's and the dead one's progress goes stale
    for i in range(60):
        await store.submit(f"queued-{i:02d}", "{}", "fp")  # type: ignore[attr-defined]


async def test_the_jobs_page_leads_with_what_needs_attention(store: LeaseStore) -> None:
    """Over 60 newer PENDING jobs the first page leads with the counts by status and
    health, then the zombie, dead and failed jobs (the healthy, done, cancelled and pending
    ones not among them), then the charts' last hour: one done, one failed, 60 queued."""
    await seed_needing_attention(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        page = (await client.get("/jobs")).text
        filtered = (await client.get("/jobs", params={"status": "PENDING"})).text
    assert page.index('id="overview"') < page.index('id="attention"') < page.index('id="jobs"')
    attention = section(page, "attention")
    keys = re.findall(r'<tr class="attention" data-key="([^"]+)"', attention)
    assert keys == ["dead-1", "zombie-1", "failed-1"], keys
    assert "ProviderFailed: no" in row_of(attention, 'data-key="failed-1"')
    for tile in ("zombie 1", "dead 1", "healthy 1", "FAILED 1", "PENDING 60", "RUNNING 3"):
        assert f">{tile}</a>" in page, tile
    assert chart_total(page, "chart-done") == chart_total(page, "chart-failed") == 1
    assert re.search(r'id="chart-queued"[^>]*data-peak="60"', page)
    assert 'id="overview"' not in filtered and "PENDING 60" in filtered


async def test_the_live_jobs_stream_carries_the_summary(store: LeaseStore) -> None:
    """The jobs page's live stream sends the summary with the rows (a job going zombie
    shows there without a reload); a filtered view's stream has none."""
    await seed_needing_attention(store)
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        async with aconnect_sse(client, "GET", "/live/jobs") as source:
            first = (await anext(aiter(source.aiter_sse()))).data
        async with aconnect_sse(client, "GET", "/live/jobs?status=PENDING") as source:
            pending = (await anext(aiter(source.aiter_sse()))).data
    assert 'id="attention"' in first and 'data-key="zombie-1"' in section(first, "attention")
    assert 'data-part="overview"' not in pending and 'data-part="jobs-body"' in pending


class Reads:
    """A real store, recording each listing read's status and limit."""

    def __init__(self, store: LeaseStore) -> None:
        self._store, self.listed = store, list[tuple[str | None, int]]()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name != "list_page":
            return found

        async def listed(**kwargs: Any) -> Any:
            self.listed.append((kwargs.get("status"), kwargs["limit"]))
            return await found(**kwargs)

        return listed


async def test_the_summary_reads_a_bounded_number_of_records(store: LeaseStore) -> None:
    """The summary costs four listing reads of at most RUNNING_READ records each (one per
    status it shows), whatever the store holds: it never walks every job."""
    await seed_needing_attention(store)
    reads = Reads(store)
    async with serving(reads) as base, httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/jobs")).status_code == 200
    summary = [read for read in reads.listed if read[0] is not None]
    assert sorted(str(s) for s, _ in summary) == ["DONE", "FAILED", "PENDING", "RUNNING"]
    assert all(limit <= RUNNING_READ for _, limit in reads.listed), reads.listed


def test_per_minute_counts_and_queue_depth_follow_the_records() -> None:
    """A finished job counts in its finished_at's minute; a job is queued from created_at
    to started_at (a handed-back one again from its update), by the records' own times."""
    now = 10_000.0

    def job(key: str, status: Status, **times: float) -> JobState:
        return JobState(key, status, read_at=now, **times)  # type: ignore[arg-type]

    done = [
        job("a", Status.DONE, created_at=now - 600, started_at=now - 590, finished_at=now - 5),
        job("b", Status.DONE, created_at=now - 600, started_at=now - 500, finished_at=now - 65),
        job("c", Status.DONE, created_at=now - 9000, finished_at=now - 4000),  # out of the hour
    ]
    counts = per_minute(done, now)
    assert len(counts) == 60 and counts[-1] == 1 and counts[-2] == 1 and sum(counts) == 2
    waiting = [
        job("p", Status.PENDING, created_at=now - 90),
        job("r", Status.PENDING, created_at=now - 900, started_at=now - 800, updated_at=now - 30),
        *done,
    ]
    depth = queue_depth(waiting, now)
    assert depth[-1] == 2 and depth[-2] == 1 and depth[-3] == 0
    assert depth[-10] == 1 and depth[-11] == 2  # b started 500 s ago, a 590 s ago


async def test_the_workers_page_shows_running_health_and_throughput(store: LeaseStore) -> None:
    """A worker's running job shows its health (zombie) with its stage; the worker's jobs
    done and failed in the last ten minutes are counted (another worker's are not); the
    live stream sends the same."""
    await acquired(store, "w-zombie", "worker-a#1.aa", max_no_progress=0.2)
    await store.commit(await acquired(store, "w-done", "worker-a#2.bb"), '"ok"')
    await store.fail(await acquired(store, "w-failed", "worker-a#3.cc"), "ProviderFailed: x")
    await store.commit(await acquired(store, "other-done", "worker-b#1.dd"), '"ok"')
    beat = WorkerInfo("worker-a", "host-a", 7, 1, 4, 0.0, 0.0, jobs=("w-zombie",))
    await store.worker_beat(beat, 30)  # type: ignore[attr-defined]
    await asyncio.sleep(0.6)  # real: progress goes stale on the store's own clock, read over HTTP
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:
        page = (await client.get("/workers")).text
        async with aconnect_sse(client, "GET", "/live/workers") as source:
            live = await anext(aiter(source.aiter_sse()))
    row = row_of(page, 'data-id="worker-a"')
    assert 'data-key="w-zombie" data-health="zombie"' in row and "health-zombie" in row
    assert 'data-done="1" data-failed="1"' in row
    assert live.event == "workers" and 'data-health="zombie"' in live.data
    assert 'data-stream="/live/workers"' in page


async def test_the_live_workers_stream_sends_only_changes(store: LeaseStore) -> None:
    """An open workers stream sends its first state, then nothing while nothing changes
    (the "last seen" age ticks on the page, not over the wire); a new beat is sent."""
    beat = WorkerInfo("worker-q", "host-q", 7, 0, 4, 0.0, 0.0)
    await store.worker_beat(beat, 30)  # type: ignore[attr-defined]
    events: list[str] = []
    async with serving(store, refresh=0.1) as base, httpx.AsyncClient(base_url=base) as client:

        async def listen() -> None:
            async with aconnect_sse(client, "GET", "/live/workers") as source:
                async for event in source.aiter_sse():
                    events.append(event.data)

        listener = asyncio.create_task(listen())
        # real: the live stream comes over a loopback socket from real uvicorn
        await asyncio.sleep(1.5)
        assert len(events) == 1 and 'data-id="worker-q"' in events[0], events
        await store.worker_beat(beat, 30)  # type: ignore[attr-defined]
        await asyncio.sleep(1.0)
        listener.cancel()
    assert len(events) == 2, events
