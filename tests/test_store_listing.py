"""Each store's own side of the job listing: SQLite's migration and query plans, Redis's
backfill of jobs from before its creation index and its bounded filtered reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease.errors import CorruptRecord
from ai_lease.lease.listing import decode_cursor
from ai_lease.stores.redis import listing as redis_listing
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite import listing as sqlite_listing
from ai_lease.stores.sqlite.listing import _page_query
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.redis_server import RedisServer


def _old_database(path: Path) -> None:
    """A file as ai-lease wrote it before the listing: no created_us column, no index."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE ai_lease_jobs (key TEXT PRIMARY KEY, status TEXT NOT NULL,"
        " lease_expires_at REAL, record BLOB NOT NULL)"
    )
    for n, created in enumerate([1_700_000_003.5, 1_700_000_001.25, 1_700_000_002.0]):
        record = {"schema": 1, "status": "PENDING", "token": 0, "created_at": created}
        conn.execute(
            "INSERT INTO ai_lease_jobs VALUES (?, 'PENDING', NULL, ?)",
            (f"old-{n}", orjson.dumps(record)),
        )
    conn.execute("INSERT INTO ai_lease_jobs VALUES ('broken', 'DONE', NULL, 'garbage')")
    conn.commit()
    conn.close()


async def test_an_old_sqlite_file_is_migrated_and_listed(tmp_path: Path) -> None:
    """A file from before the listing gets its created_us column (filled from each record)
    and indexes on open; its jobs list newest first, the broken row reported, and new jobs
    come before the old ones."""
    _old_database(tmp_path / "old.db")
    store = SQLiteStore(tmp_path / "old.db")
    try:
        reported: list[CorruptRecord] = []
        page = await store.list_page(on_corrupt=reported.append)
        assert [j.key for j in page.jobs] == ["old-0", "old-2", "old-1"]
        assert [exc.key for exc in reported] == ["broken"]
        await store.submit("new", "{}", "fp")
        assert (await store.list_page(limit=1)).jobs[0].key == "new"
        assert await store.count_jobs() == {"PENDING": 4, "DONE": 1}
    finally:
        await store.aclose()
    conn = sqlite3.connect(tmp_path / "old.db")
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    created = conn.execute("SELECT created_us FROM ai_lease_jobs WHERE key='old-1'").fetchone()
    conn.close()
    assert {"ai_lease_jobs_by_created", "ai_lease_jobs_by_status_created"} <= names
    assert created == (1_700_000_001_250_000,)


@pytest.mark.parametrize(
    ("status", "index"),
    [(None, "ai_lease_jobs_by_created"), ("RUNNING", "ai_lease_jobs_by_status_created")],
)
async def test_sqlite_pages_read_an_index_without_offset(
    sqlite_store: SQLiteStore, status: str | None, index: str
) -> None:
    """A deep page is a covering-index search from the cursor (no OFFSET, no scan, no sort),
    then a lookup of the page's own records."""
    await sqlite_store.submit("job", "{}", "fp")
    sql, args = _page_query("created_us", status, None, (1_800_000_000_000_000, "k"))
    assert "OFFSET" not in sql and "LIKE" not in sql

    def plan(conn: sqlite3.Connection) -> str:
        rows = conn.execute(f"EXPLAIN QUERY PLAN {sql}", [*args, 50]).fetchall()
        return " | ".join(row[-1] for row in rows)

    text = await sqlite_store._run("plan", plan)
    assert f"SEARCH ai_lease_jobs USING COVERING INDEX {index}" in text
    assert "TEMP B-TREE" not in text and "SCAN ai_lease_jobs" not in text


async def test_sqlite_walks_the_creation_index_for_a_broad_prefix(
    sqlite_store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix many keys share is read off the creation index (not by sorting its key
    range): the pages still hold exactly its keys, newest first, each once."""
    monkeypatch.setattr(sqlite_listing, "PREFIX_SORT_MAX", 3)
    keys = []
    for n in range(12):
        keys.append(f"p%-{n:02}")
        await sqlite_store.submit(keys[-1], "{}", "fp")
        await sqlite_store.submit(f"pa-{n:02}", "{}", "fp")  # '%' is no wildcard
    listed, after = [], None
    while True:
        page = await sqlite_store.list_page(prefix="p%", limit=5, after=after)
        listed += [job.key for job in page.jobs]
        if (after := page.next_cursor) is None:
            break
    assert listed == keys[::-1]


async def _redis_store(server: RedisServer) -> RedisStore:
    return RedisStore.from_url(server.url, op_timeout=2.0)


async def test_redis_backfills_jobs_from_before_the_index_once(redis_server: RedisServer) -> None:
    """Jobs stored before the creation index (index, counts and marker gone) are indexed
    by the first listing call, once (the marker key), and listed and counted."""
    redis_server.flushall()
    store = await _redis_store(redis_server)
    try:
        for n in range(7):
            await store.submit(f"early-{n}", "{}", "fp")
        await store.commit((await _own(store, "early-done")), "r")
        tag = "{ai_lease:queue}"
        await store._client.delete(f"{tag}:created", f"{tag}:counts", f"{tag}:created_ready")
        fresh = await _redis_store(redis_server)
        try:
            page = await fresh.list_page(limit=3)
            assert [j.key for j in page.jobs] == ["early-done", "early-6", "early-5"]
            assert await fresh.count_jobs() == {"PENDING": 7, "DONE": 1}
            assert await store._client.exists(f"{tag}:created_ready")
            assert await store._client.zcard(f"{tag}:created") == 8
        finally:
            await fresh.aclose()
    finally:
        await store.aclose()


async def _own(store: RedisStore, key: str) -> Any:
    outcome = await store.acquire(key, "A", ttl=30, max_no_progress=30)
    return outcome.fence  # type: ignore[union-attr]


async def test_redis_filtered_pages_read_a_bounded_slice(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a filter, one call reads at most LIST_BOUND index entries: a page may come back
    short (even empty) with a cursor, and following the cursors finds every match once."""
    redis_server.flushall()
    monkeypatch.setattr(redis_listing, "LIST_BOUND", 10)
    store = await _redis_store(redis_server)
    try:
        await _own(store, "running-oldest")
        for n in range(30):
            await store.submit(f"pending-{n:02}", "{}", "fp")
        await _own(store, "running-newest")
        first = await store.list_page(status="RUNNING", limit=5)
        assert [j.key for j in first.jobs] == ["running-newest"] and first.next_cursor
        assert decode_cursor(first.next_cursor)[1] == "pending-21"  # the 10th entry read
        pages, found, after = 1, [], first.next_cursor
        while after is not None:
            page = await store.list_page(status="RUNNING", limit=5, after=after)
            found += [j.key for j in page.jobs]
            pages, after = pages + 1, page.next_cursor
        assert found == ["running-oldest"] and pages == 4
    finally:
        await store.aclose()


async def test_redis_reads_a_narrow_prefix_off_the_name_index(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefix few keys share is found in one call however deep its jobs are (a range of
    the name index); one many share walks the creation index, each match once."""
    redis_server.flushall()
    monkeypatch.setattr(redis_listing, "LIST_BOUND", 6)
    store = await _redis_store(redis_server)
    try:
        deep = [f"deep%-{n}" for n in range(3)]
        for key in deep:
            await store.submit(key, "{}", "fp")
        broad = []
        for n in range(10):
            broad.append(f"broad-{n:02}")
            await store.submit(broad[-1], "{}", "fp")
            await store.submit(f"broad_{n:02}", "{}", "fp")  # '_' is no wildcard
        page = await store.list_page(prefix="deep%", limit=50)
        assert [j.key for j in page.jobs] == deep[::-1] and page.next_cursor is None
        found, after = [], None
        while True:
            page = await store.list_page(prefix="broad-", limit=4, after=after)
            found += [j.key for j in page.jobs]
            if (after := page.next_cursor) is None:
                break
        assert found == broad[::-1]
        assert (await store.remove("deep%-1")).removed
        left = await store.list_page(prefix="deep%")
        assert [j.key for j in left.jobs] == ["deep%-2", "deep%-0"]
    finally:
        await store.aclose()
