"""The SQLite store commits writes that queue behind its thread together, each still whole.

Writes that arrive while the store's one thread is busy share one transaction: a write that
fails is rolled back alone (the others run again without it), a caller that gave up before
its write ran has nothing applied, and no write is answered before the commit that holds it.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from ai_lease import Acquired
from ai_lease.errors import JobConflict
from ai_lease.lease.listing import created_us
from ai_lease.stores.sqlite.store import SQLiteStore


async def _hold_thread(store: SQLiteStore) -> tuple[threading.Event, asyncio.Future[None]]:
    """Keep the store's thread busy until the event is set, so writes queue up behind it."""
    release, started = threading.Event(), threading.Event()

    def block(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)

    busy = asyncio.ensure_future(store._run("block", block))
    await asyncio.to_thread(started.wait, 10)
    return release, busy


async def test_concurrent_jobs_are_all_committed_with_their_timelines(tmp_path: Path) -> None:
    """Many jobs acquired and committed at once all end DONE, each with its own timeline."""
    store = SQLiteStore(tmp_path / "g.db")

    async def job(i: int) -> None:
        got = await store.acquire(f"k{i}", f"node-{i}", ttl=30, max_no_progress=5)
        assert isinstance(got, Acquired)
        await store.commit(got.fence, f'"r{i}"')

    try:
        await asyncio.gather(*(job(i) for i in range(40)))
        for i in range(40):
            rec = await store.get(f"k{i}")
            assert rec is not None and rec.status.value == "DONE" and rec.output == f"r{i}"
            entries, dropped = await store.timeline(f"k{i}")
            assert [e.kind for e in entries] == ["acquired", "committed"] and dropped == 0
    finally:
        await store.aclose()


async def test_a_failing_write_in_a_group_is_rolled_back_alone(tmp_path: Path) -> None:
    """A write that raises after writing is undone; the writes beside it are kept."""
    store = SQLiteStore(tmp_path / "g.db")
    await store.acquire("conflict", "node-0", ttl=30, max_no_progress=5, fingerprint="a")

    def half_then_fail(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO ai_lease_queue VALUES ('half', 1.0)")
        raise RuntimeError("fails after writing")

    try:
        release, busy = await _hold_thread(store)
        first = asyncio.ensure_future(store.acquire("a", "node-1", ttl=30, max_no_progress=5))
        failing = asyncio.ensure_future(store._write("half", half_then_fail))
        conflict = asyncio.ensure_future(
            store.acquire("conflict", "node-2", ttl=30, max_no_progress=5, fingerprint="b")
        )
        last = asyncio.ensure_future(store.acquire("b", "node-3", ttl=30, max_no_progress=5))
        await asyncio.sleep(0.05)  # real: the writes queue behind the held store thread
        release.set()
        await busy
        assert isinstance(await first, Acquired) and isinstance(await last, Acquired)
        with pytest.raises(RuntimeError, match="fails after writing"):
            await failing
        with pytest.raises(JobConflict):
            await conflict
        queued = await store._run(
            "q", lambda c: c.execute("SELECT count(*) FROM ai_lease_queue").fetchone()[0]
        )
        assert queued == 0
        for key in ("a", "b"):
            rec = await store.get(key)
            assert rec is not None and rec.status.value == "RUNNING"
    finally:
        await store.aclose()


async def test_a_write_given_up_before_it_ran_is_not_applied(tmp_path: Path) -> None:
    """A caller cancelled while its write waited for the thread leaves no trace of it."""
    store = SQLiteStore(tmp_path / "g.db")
    try:
        release, busy = await _hold_thread(store)
        gone = asyncio.ensure_future(store.acquire("gone", "node-1", ttl=30, max_no_progress=5))
        kept = asyncio.ensure_future(store.acquire("kept", "node-1", ttl=30, max_no_progress=5))
        await asyncio.sleep(0.05)  # real: the writes queue behind the held store thread
        gone.cancel()
        release.set()
        await busy
        assert isinstance(await kept, Acquired)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert await store.get("gone") is None
        assert (await store.timeline("gone"))[0] == []
    finally:
        await store.aclose()


async def test_an_answered_write_is_committed_for_another_connection(tmp_path: Path) -> None:
    """Once a write is answered, another process's connection reads it."""
    store = SQLiteStore(tmp_path / "g.db")
    try:
        got = await asyncio.gather(
            *(store.acquire(f"k{i}", "node-1", ttl=30, max_no_progress=5) for i in range(10))
        )
        assert all(isinstance(g, Acquired) for g in got)
        with sqlite3.connect(tmp_path / "g.db") as other:
            (n,) = other.execute("SELECT count(*) FROM ai_lease_jobs").fetchone()
            (t,) = other.execute("SELECT count(*) FROM ai_lease_timeline").fetchone()
        assert (n, t) == (10, 10)
    finally:
        await store.aclose()


async def test_the_indexed_columns_follow_the_record_through_a_job(tmp_path: Path) -> None:
    """Status, lease expiry and creation time in the row match the record after each write."""
    store = SQLiteStore(tmp_path / "g.db")

    async def columns_match() -> None:
        row = await store._run(
            "row",
            lambda c: c.execute(
                "SELECT status, lease_expires_at, created_us FROM ai_lease_jobs WHERE key = 'k'"
            ).fetchone(),
        )
        rec = await store.get("k")
        assert rec is not None
        assert row == (rec.status.value, rec.lease_expires_at, created_us(rec.created_at))

    try:
        await store.submit("k", '{"input": "x"}', "fp")
        await columns_match()
        got = await store.acquire("k", "node-1", ttl=30, max_no_progress=5)
        assert isinstance(got, Acquired)
        await columns_match()
        renewal = await store.renew(
            got.fence, ttl=60, stage="load", progress_version=1, max_no_progress=5, grace=1
        )
        assert renewal.ok
        await columns_match()
        await store.commit(got.fence, '"done"')
        await columns_match()
        assert (await store.count_jobs()).get("DONE") == 1
        assert await store.retry("k") is not None
        await columns_match()
    finally:
        await store.aclose()


async def test_a_write_to_a_closed_store_fails_at_once_every_time(tmp_path: Path) -> None:
    """After aclose a write raises at once, and so does the next (none waits for a thread)."""
    store = SQLiteStore(tmp_path / "g.db")
    await store.acquire("a", "node-1", ttl=30, max_no_progress=5)
    await store.aclose()
    for key in ("b", "c"):
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(store.acquire(key, "node-1", ttl=30, max_no_progress=5), 5)
