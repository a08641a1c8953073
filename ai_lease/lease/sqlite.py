"""The embedded default store: one SQLite file in WAL mode, shared by processes on one machine.

Each operation is one ``BEGIN IMMEDIATE`` transaction that reads the record, applies the
pure rule from :mod:`ai_lease.lease.rules` and writes the result, so racing processes are
serialised by SQLite's write lock. The store's clock is this machine's clock, read inside the
transaction. All SQLite work runs on one thread per store, keeping the event loop free while
another process holds the write lock (closing too). A file this user cannot write is opened
read-only: ``status``, ``ls`` and ``result`` work, a write fails saying why.

>>> store = SQLiteStore(".ai-lease/ai-lease.db")          # doctest: +SKIP
>>> outcome = await store.acquire("job-1", "node-a", ttl=30, max_no_progress=5)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ai_lease.errors import CorruptRecord, CorruptSink, StoreUnavailable, skip_corrupt
from ai_lease.job import JobState
from ai_lease.lease import rules
from ai_lease.lease.base import AcquireOutcome, Fence, Renewal, WorkerInfo
from ai_lease.observe.history import checked_histogram
from ai_lease.resource import AsyncResource

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ai_lease_jobs (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    lease_expires_at REAL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS ai_lease_jobs_by_expiry
    ON ai_lease_jobs (status, lease_expires_at);
CREATE TABLE IF NOT EXISTS ai_lease_queue (
    key TEXT PRIMARY KEY,
    due_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ai_lease_queue_by_due ON ai_lease_queue (due_at);
CREATE TABLE IF NOT EXISTS ai_lease_recovery (
    key TEXT PRIMARY KEY,
    due_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ai_lease_recovery_by_due ON ai_lease_recovery (due_at);
CREATE TABLE IF NOT EXISTS ai_lease_durations (
    pipeline TEXT NOT NULL,
    kind TEXT NOT NULL,
    stage TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (pipeline, kind, stage, bucket)
);
CREATE TABLE IF NOT EXISTS ai_lease_workers (
    worker_id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    info BLOB NOT NULL
);
"""


class SQLiteStore(AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on one SQLite file.

    ``clock`` is the store's clock (seconds since the epoch); tests may inject one.
    ``op_timeout`` bounds how long an operation waits for another process's write lock.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        op_timeout: float = 2.0,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = str(path)
        self.where = f"sqlite:///{self.path}"
        self._op_timeout, self._poll, self._clock = op_timeout, poll_interval, clock
        self._conn: sqlite3.Connection | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ai-lease-sqlite")
        self.read_only = False
        self.lost_data: None = None  # an embedded file does not lose data behind our back

    # -- plumbing -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None and self._not_writable():
            self._conn, self.read_only = self._open_read_only(), True
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self._op_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA synchronous=NORMAL")
            self._setup(conn)
            self._conn = conn
        return self._conn

    def _not_writable(self) -> bool:
        return (
            self.path != ":memory:"
            and os.path.exists(self.path)
            and not os.access(self.path, os.W_OK)
        )

    def _open_read_only(self) -> sqlite3.Connection:
        """``mode=ro``; where WAL's shared-memory file cannot be made either (a read-only
        directory), ``immutable=1``: nobody can write this file through us anyway."""
        uri = Path(self.path).resolve().as_uri()
        for query in ("mode=ro", "mode=ro&immutable=1"):
            conn = sqlite3.connect(
                f"{uri}?{query}", uri=True, timeout=self._op_timeout, check_same_thread=False
            )
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.OperationalError:
                conn.close()
        raise sqlite3.OperationalError(f"cannot open {self.path} even read-only")

    def _setup(self, conn: sqlite3.Connection) -> None:
        """WAL mode and the schema. Switching a new file to WAL does not wait on SQLite's busy
        handler, so processes opening one file at once retry here, within op_timeout."""
        deadline = time.monotonic() + self._op_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise
                time.sleep(0.01)

    async def _run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))
        except (sqlite3.Error, OSError) as exc:
            # A failed statement or transaction is rolled back: nothing was applied.
            detail = str(exc)
            if self.read_only and "readonly" in detail:
                detail = (
                    f"the file is not writable by this user, so it was opened read-only: {op} "
                    "needs write access (make the file and its directory writable)"
                )
            raise StoreUnavailable(self.where, op, detail, maybe_applied=False) from exc

    def _load(self, conn: sqlite3.Connection, key: str, now: float) -> JobState | None:
        row = conn.execute("SELECT record FROM ai_lease_jobs WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        try:
            data = orjson.loads(row[0])
        except orjson.JSONDecodeError:
            raise CorruptRecord(key, "record is not JSON") from None
        if not isinstance(data, dict) or data.get("schema") != 1:
            raise CorruptRecord(key, "record has no ai_lease schema marker")
        return JobState.from_fields(key, data, now)

    @staticmethod
    def _save(conn: sqlite3.Connection, job: JobState) -> None:
        data = job.to_dict()
        del data["key"], data["read_at"]
        data["schema"] = 1
        conn.execute(
            "INSERT INTO ai_lease_jobs (key, status, lease_expires_at, record) VALUES (?,?,?,?)"
            " ON CONFLICT(key) DO UPDATE SET status = excluded.status,"
            " lease_expires_at = excluded.lease_expires_at, record = excluded.record",
            (job.key, job.status.value, job.lease_expires_at, orjson.dumps(data)),
        )

    async def _write(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction (``BEGIN IMMEDIATE``: processes queue here)."""

        def work(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                answer = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return answer

        return await self._run(op, work)

    async def _transact(
        self, op: str, key: str, rule: Callable[[JobState | None, float], tuple[JobState | None, T]]
    ) -> T:
        """Read, decide and write one job's record in one write transaction."""

        def work(conn: sqlite3.Connection) -> T:
            now = self._clock()
            new, answer = rule(self._load(conn, key, now), now)
            if new is not None:
                self._save(conn, new)
            return answer

        return await self._write(op, work)

    # -- the protocol -------------------------------------------------------------------------

    async def acquire(
        self,
        key: str,
        owner_id: str,
        *,
        ttl: float,
        max_no_progress: float,
        stall_policy: str = "expire",
        fingerprint: str | None = None,
        max_attempts: int | None = None,
    ) -> AcquireOutcome:
        return await self._transact(
            "acquire",
            key,
            lambda rec, now: rules.acquire(
                rec,
                key,
                owner_id,
                now,
                ttl=ttl,
                max_no_progress=max_no_progress,
                stall_policy=stall_policy,
                fingerprint=fingerprint,
                max_attempts=max_attempts,
            ),
        )

    async def renew(
        self,
        fence: Fence,
        *,
        ttl: float,
        stage: str | None,
        progress_version: int,
        max_no_progress: float,
        grace: float,
    ) -> Renewal:
        return await self._transact(
            "renew",
            fence.key,
            lambda rec, now: rules.renew(
                rec,
                fence,
                now,
                ttl=ttl,
                stage=stage,
                progress_version=progress_version,
                max_no_progress=max_no_progress,
                grace=grace,
            ),
        )

    async def release(
        self,
        fence: Fence,
        *,
        error: str | None = None,
        snapshot: str | None = None,
        interrupted: bool = False,
    ) -> bool:
        return await self._transact(
            "release",
            fence.key,
            lambda rec, now: rules.release(
                rec, fence, now, error=error, snapshot=snapshot, interrupted=interrupted
            ),
        )

    async def commit(
        self, fence: Fence, result: str, *, finish_reason: str | None = None
    ) -> JobState:
        return await self._transact(
            "commit",
            fence.key,
            lambda rec, now: rules.commit(rec, fence, now, result, finish_reason),
        )

    async def fail(self, fence: Fence, reason: str) -> JobState:
        return await self._transact(
            "fail", fence.key, lambda rec, now: rules.fail(rec, fence, now, reason)
        )

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        return await self._transact(
            "report_stall",
            fence.key,
            lambda rec, now: rules.report_stall(rec, fence, now, stage, snapshot),
        )

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        def work(conn: sqlite3.Connection) -> JobState | None:
            now = self._clock()
            new, job = rules.cancel(self._load(conn, key, now), now, reason)
            if new is not None:
                self._save(conn, new)
                conn.execute("DELETE FROM ai_lease_queue WHERE key = ?", (key,))
                conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))
            return job

        return await self._write("cancel", work)

    async def get(self, key: str) -> JobState | None:
        return await self._run("get", lambda conn: self._load(conn, key, self._clock()))

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        def work(conn: sqlite3.Connection) -> list[JobState | CorruptRecord]:
            where, args = ("WHERE status = ?", [status]) if status else ("", [])
            rows = conn.execute(
                f"SELECT key FROM ai_lease_jobs {where} ORDER BY rowid DESC LIMIT ?",
                [*args, limit],
            ).fetchall()
            now = self._clock()
            return [job for (key,) in rows if (job := self._load_or_corrupt(conn, key, now))]

        jobs = []
        for job in await self._run("list_jobs", work):
            if isinstance(job, CorruptRecord):
                skip_corrupt(job, on_corrupt)
            else:
                jobs.append(job)
        return jobs

    def _load_or_corrupt(
        self, conn: sqlite3.Connection, key: str, now: float
    ) -> JobState | CorruptRecord | None:
        try:
            return self._load(conn, key, now)
        except CorruptRecord as exc:  # reported on the event loop's side, by the caller
            return exc

    # -- the job queue -------------------------------------------------------------------------

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        def work(conn: sqlite3.Connection) -> JobState:
            now = self._clock()
            new, job = rules.submit(
                self._load(conn, key, now), key, now, spec=spec, fingerprint=fingerprint
            )
            if new is not None:
                self._save(conn, new)
            if not job.status.terminal:
                conn.execute(
                    "INSERT INTO ai_lease_queue VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = min(due_at, excluded.due_at)",
                    (key, now),
                )
            return job

        return await self._write("submit", work)

    async def due(self, limit: int) -> list[str]:
        """Queued jobs whose lease lapsed first (recovery before fresh work, however far back
        in the queue they sort; at most ``limit``), then the queue's due keys."""

        def work(conn: sqlite3.Connection) -> list[str]:
            now = self._clock()
            lapsed = conn.execute(
                "SELECT j.key FROM ai_lease_jobs j JOIN ai_lease_queue q ON q.key = j.key"
                " WHERE j.status = 'RUNNING' AND j.lease_expires_at <= ?"
                " ORDER BY j.lease_expires_at LIMIT ?",
                (now, limit),
            ).fetchall()
            due = conn.execute(
                "SELECT key FROM ai_lease_queue WHERE due_at <= ? ORDER BY due_at LIMIT ?",
                (now, limit),
            ).fetchall()
            return list(dict.fromkeys(key for (key,) in lapsed + due))[:limit]

        return await self._run("due", work)

    async def reschedule(self, key: str, at: float | None) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))
            if at is None:
                conn.execute("DELETE FROM ai_lease_queue WHERE key = ?", (key,))
            else:
                conn.execute(
                    "INSERT INTO ai_lease_queue VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = excluded.due_at",
                    (key, at),
                )

        await self._write("reschedule", work)

    async def recover_at(self, key: str, at: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            for table in ("ai_lease_queue", "ai_lease_recovery"):
                conn.execute(
                    f"INSERT INTO {table} VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = excluded.due_at",
                    (key, at),
                )

        await self._write("recover_at", work)

    async def due_recoveries(self, limit: int) -> list[str]:
        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT key FROM ai_lease_recovery WHERE due_at <= ? ORDER BY due_at LIMIT ?",
                (self._clock(), limit),
            )
            return [key for (key,) in rows]

        return await self._run("due_recoveries", work)

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        def work(conn: sqlite3.Connection) -> None:
            now = self._clock()
            blob = orjson.dumps({**asdict(info), "last_seen": now})
            conn.execute(
                "INSERT INTO ai_lease_workers VALUES (?, ?, ?) ON CONFLICT(worker_id) DO UPDATE"
                " SET expires_at = excluded.expires_at, info = excluded.info",
                (info.worker_id, now + ttl, blob),
            )

        await self._run("worker_beat", work)

    async def worker_gone(self, worker_id: str) -> None:
        await self._run(
            "worker_gone",
            lambda conn: conn.execute(
                "DELETE FROM ai_lease_workers WHERE worker_id = ?", (worker_id,)
            ),
        )

    async def list_workers(self, *, on_corrupt: CorruptSink | None = None) -> list[WorkerInfo]:
        def work(conn: sqlite3.Connection) -> list[tuple[Any, Any]]:
            return conn.execute(
                "SELECT worker_id, info FROM ai_lease_workers WHERE expires_at > ?"
                " ORDER BY worker_id",
                (self._clock(),),
            ).fetchall()

        out = []
        for worker_id, blob in await self._run("list_workers", work):
            try:
                if not isinstance(blob, str | bytes):
                    raise CorruptRecord(str(worker_id), "the entry is not JSON", kind="worker")
                out.append(WorkerInfo.from_json(str(worker_id), blob))
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
        return out

    # -- duration history ------------------------------------------------------------------

    async def add_durations(self, counts: Mapping[tuple[str, str, str], Mapping[int, int]]) -> None:
        rows = [
            (*series, bucket, n)
            for series, buckets in counts.items()
            for bucket, n in buckets.items()
        ]

        await self._write(
            "add_durations",
            lambda conn: conn.executemany(
                "INSERT INTO ai_lease_durations VALUES (?, ?, ?, ?, ?) ON CONFLICT"
                " (pipeline, kind, stage, bucket) DO UPDATE SET count = count + excluded.count",
                rows,
            ),
        )

    async def load_durations(
        self, *, on_corrupt: CorruptSink | None = None
    ) -> dict[tuple[str, str, str], dict[int, int]]:
        def work(conn: sqlite3.Connection) -> dict[tuple[Any, ...], list[tuple[Any, Any]]]:
            rows: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}
            for pipeline, kind, stage, bucket, n in conn.execute(
                "SELECT pipeline, kind, stage, bucket, count FROM ai_lease_durations"
            ):
                rows.setdefault((pipeline, kind, stage), []).append((bucket, n))
            return rows

        out: dict[tuple[str, str, str], dict[int, int]] = {}
        for parts, buckets in (await self._run("load_durations", work)).items():
            name = "/".join(map(str, parts))[:120]
            try:
                series, counts = checked_histogram(name, parts, buckets)
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
                continue
            out[series] = counts
        return out

    async def wait(self, key: str, timeout: float) -> None:
        """Return when the job's record changes, or after ``timeout`` seconds (polling)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first = await self._run("wait", lambda conn: _version(conn, key))
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(self._poll, left))
            if await self._run("wait", lambda conn: _version(conn, key)) != first:
                return

    async def aclose(self) -> None:
        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        # Work queued behind the close may still run (seconds, on a held write lock):
        # wait for it off the event loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    async def data_lost(self) -> None:
        """Always None: an embedded file does not lose data behind its users' backs."""
        return None

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"


def _version(conn: sqlite3.Connection, key: str) -> Any:
    return conn.execute(
        "SELECT status, lease_expires_at, length(record) FROM ai_lease_jobs WHERE key = ?", (key,)
    ).fetchone()
