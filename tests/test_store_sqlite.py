"""SQLite-specific behaviour: corrupt rows, an unusable file, a held write lock, its clock."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from ai_lease import CorruptRecord, Fence, Following, StoreUnavailable
from ai_lease.lease import Acquired
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.clock import VirtualClock


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
        conn.execute(
            "INSERT INTO ai_lease_jobs (key, status, lease_expires_at, record)"
            " VALUES ('bad', 'RUNNING', NULL, ?)",
            (record,),
        )
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
    clock = VirtualClock(1_800_000_000.0)
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
    clock = VirtualClock(1_800_000_000.0)
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


_READ_ONLY_PROBE = """
import asyncio, os, sys
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.errors import StoreUnavailable
if os.geteuid() == 0:  # root writes anything: become nobody (after the imports)
    os.setgid(65534)
    os.setuid(65534)

async def main():
    store = SQLiteStore(sys.argv[1])
    try:
        job = await store.get("k")
        print("read", job.key, job.status.value)
        try:
            await store.submit("other", "{}", "fp")
        except StoreUnavailable as exc:
            print("write refused:", exc, exc.maybe_applied)
    finally:
        await store.aclose()

asyncio.run(main())
"""


async def _seed(path: Path) -> None:
    store = SQLiteStore(path)
    await store.submit("k", "{}", "fp")
    await store.aclose()


def test_read_only_file_can_still_be_read() -> None:
    """A database file (and directory) this user cannot write is opened read-only: reads
    work, a write fails with a clear error (nothing applied)."""
    import asyncio
    import subprocess
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ai-lease-ro-"))
    path = folder / "ai-lease.db"
    asyncio.run(_seed(path))
    path.chmod(0o444)
    folder.chmod(0o555)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _READ_ONLY_PROBE, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parents[1],
        )
    finally:
        folder.chmod(0o755)
        path.chmod(0o644)
        for file in folder.iterdir():
            file.unlink()
        folder.rmdir()
    assert done.returncode == 0, done.stderr
    assert "read k PENDING" in done.stdout, done.stdout
    assert "write refused:" in done.stdout and "opened read-only" in done.stdout
    assert done.stdout.strip().endswith("False"), "a refused write is not maybe-applied"


async def test_aclose_does_not_block_the_event_loop(tmp_path: Path) -> None:
    """aclose() waits for work queued behind it (here one held up by another process's
    write lock) off the event loop: the loop keeps ticking."""
    import asyncio
    import time

    path = tmp_path / "ai-lease.db"
    store = SQLiteStore(path, op_timeout=1.0)
    await store.get("warm-up")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            # real: measures the loop's real timers while SQLite's thread waits on a lock
            await asyncio.sleep(0.02)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    tick = asyncio.create_task(ticker())
    try:
        closing = asyncio.create_task(store.aclose())
        await asyncio.sleep(0)  # the close is queued first
        with pytest.raises(StoreUnavailable):
            await store.submit("late", "{}", "fp")  # queued behind it, waits for the lock
        await closing
    finally:
        tick.cancel()
        other.execute("ROLLBACK")
        other.close()
    assert max(gaps) < 0.5, f"the event loop stalled {max(gaps):.2f}s in aclose()"


async def test_record_written_before_the_new_fields_loads_and_runs_on(tmp_path: Path) -> None:
    """A file from before renew_interval, takeover_cause and what-ran were kept: its jobs
    read with those unset and carry on (the record is a JSON document: no column to add)."""
    old = {
        "schema": 1,
        "status": "RUNNING",
        "owner_id": "api-1#1.aa",
        "token": 7,
        "heartbeat_at": 1_800_000_000.0,
        "last_progress_at": 1_800_000_000.0,
        "lease_expires_at": 1_800_000_030.0,
        "max_no_progress": 5.0,
        "attempts": 1,
        "takeovers": 0,
        "created_at": 1_800_000_000.0,
        "updated_at": 1_800_000_000.0,
    }
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute(
        "CREATE TABLE ai_lease_jobs (key TEXT PRIMARY KEY, status TEXT NOT NULL,"
        " lease_expires_at REAL, record BLOB NOT NULL)"
    )
    conn.execute(
        "INSERT INTO ai_lease_jobs VALUES ('old', 'RUNNING', ?, ?)",
        (old["lease_expires_at"], orjson.dumps(old)),
    )
    conn.commit()
    conn.close()
    clock = VirtualClock(1_800_000_010.0)
    store = SQLiteStore(tmp_path / "old.db", clock=clock)
    try:
        job = await store.get("old")
        assert job is not None and job.renew_interval is None and job.takeover_cause is None
        assert job.provider is None and job.durations is None and job.health(1.0) is not None
        done = await store.commit(Fence("old", "api-1#1.aa", 7), '"ok"')
        assert done.status.value == "DONE" and done.finished_at == clock.now
    finally:
        await store.aclose()
