"""SQLite-specific behaviour: corrupt rows, an unusable file, a held write lock, its clock."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ai_lease import CorruptRecord, Fence, Following, StoreUnavailable
from ai_lease.lease import Acquired
from ai_lease.lease.sqlite import SQLiteStore


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "record",
    [
        b"{not json",
        b'{"status": "RUNNING"}',
        b'{"schema": 1, "status": "RUNNING", "token": "x"}',
        b'{"schema": 1, "status": "SLEEPING"}',
    ],
)
async def test_corrupt_row_is_named_and_left_alone(tmp_path: Path, record: bytes) -> None:
    """A foreign or broken row raises CorruptRecord naming the key; other jobs still work."""
    store = SQLiteStore(tmp_path / "s.db")
    try:
        ok = await store.acquire("good", "A", ttl=30, max_no_progress=5)
        assert isinstance(ok, Acquired)
        conn = sqlite3.connect(tmp_path / "s.db")
        conn.execute("INSERT INTO ai_lease_jobs VALUES ('bad', 'RUNNING', NULL, ?)", (record,))
        conn.commit()
        ops = (
            lambda: store.get("bad"),
            lambda: store.acquire("bad", "B", ttl=30, max_no_progress=5),
            lambda: store.commit(Fence("bad", "B", 1), "r"),
        )
        for op in ops:
            with pytest.raises(CorruptRecord, match="'bad'"):
                await op()
        raw = conn.execute("SELECT record FROM ai_lease_jobs WHERE key='bad'").fetchone()[0]
        assert raw == record
        conn.close()
        job = await store.get("good")
        assert job is not None and job.owner_id == "A"
    finally:
        await store.aclose()


async def test_unusable_path_is_store_unavailable(tmp_path: Path) -> None:
    """A database path that cannot be created gives StoreUnavailable naming the path."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = SQLiteStore(blocker / "s.db")
    try:
        with pytest.raises(StoreUnavailable, match=r"file/s\.db"):
            await store.get("k")
    finally:
        await store.aclose()


async def test_held_write_lock_times_out_as_unavailable(tmp_path: Path) -> None:
    """Another process holding the write lock past op_timeout gives StoreUnavailable."""
    store = SQLiteStore(tmp_path / "s.db", op_timeout=0.2)
    try:
        await store.get("k")  # creates the schema
        blocker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.acquire("k", "A", ttl=30, max_no_progress=5)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert isinstance(await store.acquire("k", "A", ttl=30, max_no_progress=5), Acquired)
    finally:
        await store.aclose()


async def test_lease_expiry_follows_the_store_clock(tmp_path: Path) -> None:
    """Expiry is judged by the store's clock: advancing it lapses the lease, no sleep needed."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "s.db", clock=clock)
    try:
        first = await store.acquire("k", "A", ttl=30, max_no_progress=5)
        assert isinstance(first, Acquired)
        clock.now += 29.9
        assert isinstance(await store.acquire("k", "B", ttl=30, max_no_progress=5), Following)
        clock.now += 0.2
        taken = await store.acquire("k", "B", ttl=30, max_no_progress=5)
        assert isinstance(taken, Acquired) and taken.fence.token > first.fence.token
    finally:
        await store.aclose()


async def test_store_refuses_blind_renewal_by_its_clock(tmp_path: Path) -> None:
    """No progress for budget + grace on the store's clock: the renewal is refused."""
    clock = FakeClock()
    store = SQLiteStore(tmp_path / "s.db", clock=clock)
    try:
        won = await store.acquire("k", "A", ttl=30, max_no_progress=20)
        assert isinstance(won, Acquired)
        kw = dict(ttl=30.0, stage="call_ai", max_no_progress=20.0, grace=5.0)
        for version in (1, 2, 3):  # progress every 10 s keeps it alive
            clock.now += 10
            assert (await store.renew(won.fence, progress_version=version, **kw)).ok
        clock.now += 25  # exactly budget + grace: still fine
        assert (await store.renew(won.fence, progress_version=3, **kw)).ok
        clock.now += 0.001
        refused = await store.renew(won.fence, progress_version=3, **kw)
        assert not refused.ok and refused.reason == "no_progress"
    finally:
        await store.aclose()
