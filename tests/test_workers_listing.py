"""The live workers as the dashboard's Workers page reads them (``read_workers``, which
`ai-lease workers` shares, tests/test_workers.py): a job that ended since a worker's last
beat is not shown as running, and "last seen" is judged by the store's clock."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson

from ai_lease import Acquired
from ai_lease.client import Client
from ai_lease.lease import LeaseStore
from ai_lease.lease.queue import WorkerInfo
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.ui.listing import read_workers
from tests.test_ui_app import serving

HOUR = 3600.0


async def seed(store: LeaseStore) -> None:
    """Worker w1 beats reporting two jobs: `ended` has since been committed DONE, `busy`
    still runs."""
    for key in ("ended", "busy"):
        won = await store.acquire(key, "node-a", ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        if key == "ended":
            ended = won.fence
    info = WorkerInfo("w1", "host-a", 4242, 2, 4, 0.0, time.time(), ("ended", "busy"))
    await store.worker_beat(info, ttl=30)  # type: ignore[attr-defined]
    await store.commit(ended, orjson.dumps("done").decode())


def workers_row(page: str) -> str:
    start = page.index('data-id="w1"')
    return page[start : page.index("</tr>", start)]


async def test_the_workers_page_leaves_out_a_job_that_ended(store: LeaseStore) -> None:
    """A job a worker reported at its last beat but that is DONE now is not on the Workers
    page, and the worker's running count says 1 of 4, on every store."""
    await seed(store)
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        page = (await client.get("/workers")).text
    row = workers_row(page)
    assert '<a href="/jobs/busy">busy</a>' in row, row
    assert "ended" not in row and "1/4" in row, row


async def test_read_workers_judges_last_seen_by_the_store_clock(tmp_path: Path) -> None:
    """With the store's clock an hour behind this machine's, a worker that just beat is
    seen "0 ms" ago by the store's reading (read_at), not an hour ago by the local clock."""
    store = SQLiteStore(tmp_path / "jobs.db", clock=lambda: time.time() - HOUR)
    try:
        await seed(store)
        listing = await read_workers(Client(store))
        assert [w.jobs for w in listing.found] == [("busy",)]
        assert abs(listing.read_at - listing.found[0].last_seen) < 60
        async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
            row = workers_row((await client.get("/workers")).text)
        assert " h ago" not in row and "min ago" not in row, row
    finally:
        await store.aclose()
