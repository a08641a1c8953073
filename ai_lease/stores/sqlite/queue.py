"""The SQLite store's job queue, workers and duration history: tables beside the jobs'.

The queue is a table of "look again at" times (plus the recovery looks asked for first);
workers and duration buckets have a table each. The schedule is a hint that workers
correct, never the judge.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import orjson

from ai_lease.errors import CorruptRecord, CorruptSink, skip_corrupt
from ai_lease.job import JobState, Status, validate_key
from ai_lease.lease import rules
from ai_lease.lease.admin import TERMINAL_STATUSES, Removal
from ai_lease.lease.histogram import checked_histogram
from ai_lease.lease.queue import QueueGauges, WorkerInfo, next_look, storable_worker
from ai_lease.lease.storable import exact
from ai_lease.stores.sqlite.file import SQLiteFile, unqueue

__all__ = ["SQLiteAdmin", "SQLiteQueue"]


def _upsert_looks(conn: sqlite3.Connection, key: str, at: float) -> None:
    """A recovery look at ``key`` at ``at``: in the queue and in the recovery looks."""
    for table in ("ai_lease_queue", "ai_lease_recovery"):
        conn.execute(
            f"INSERT INTO {table} VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
            " SET due_at = excluded.due_at",
            (key, at),
        )


class SQLiteQueue:
    """The :class:`~ai_lease.lease.queue.JobQueue` part of the SQLite store, and its history."""

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        spec = exact("submit", validate_key(key), "spec", spec)

        def work(conn: sqlite3.Connection) -> JobState:
            now = self._file._clock()
            new, job = rules.submit(
                self._file._load(conn, key, now), key, now, spec=spec, fingerprint=fingerprint
            )
            if new is not None:
                self._file._save(conn, new)
            if not job.status.terminal:
                conn.execute(
                    "INSERT INTO ai_lease_queue VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = min(due_at, excluded.due_at)",
                    (key, now),
                )
            return job

        return await self._file._write("submit", work)

    async def due(self, limit: int) -> list[str]:
        """Queued jobs whose lease lapsed first (recovery before fresh work, however far back
        in the queue they sort; at most ``limit``), then the queue's due keys."""

        def work(conn: sqlite3.Connection) -> list[str]:
            now = self._file._clock()
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

        return await self._file._run("due", work)

    async def reschedule(self, key: str, at: float | None) -> None:
        def work(conn: sqlite3.Connection) -> None:
            if at is None:
                unqueue(conn, key)
            else:
                conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))
                conn.execute(
                    "INSERT INTO ai_lease_queue VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = excluded.due_at",
                    (key, at),
                )

        await self._file._write("reschedule", work)

    async def look(self, key: str, ttl: float) -> JobState | None:
        """A worker's look (:func:`~ai_lease.lease.queue.look_at`): the record, and its
        queue entry moved by :func:`~ai_lease.lease.queue.next_look`, in one transaction."""

        def work(conn: sqlite3.Connection) -> JobState | None:
            record = self._file._load(conn, key, self._file._clock())
            at = next_look(record, ttl)
            if at is None:
                unqueue(conn, key)
            else:
                _upsert_looks(conn, key, at)
            return record

        return await self._file._write("look", work)

    async def recover_at(self, key: str, at: float) -> None:
        await self._file._write("recover_at", lambda conn: _upsert_looks(conn, key, at))

    async def due_recoveries(self, limit: int) -> list[str]:
        def work(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "SELECT key FROM ai_lease_recovery WHERE due_at <= ? ORDER BY due_at LIMIT ?",
                (self._file._clock(), limit),
            )
            return [key for (key,) in rows]

        return await self._file._run("due_recoveries", work)

    async def gauges(self) -> QueueGauges:
        """Jobs per status (one ``GROUP BY`` on the status index), queue entries due now and
        later (range counts on the due index), live and lapsed leases (the status/expiry
        index): one read on the store's thread."""

        def work(conn: sqlite3.Connection) -> QueueGauges:
            now = self._file._clock()
            jobs = dict.fromkeys((s.value for s in Status), 0)
            for status, n in conn.execute("SELECT status, count(*) FROM ai_lease_jobs GROUP BY 1"):
                if status in jobs:
                    jobs[status] = int(n)
            queued = "SELECT count(*) FROM ai_lease_queue WHERE due_at "
            due, later = _count(conn, queued + "<= ?", now), _count(conn, queued + "> ?", now)
            running = "SELECT count(*) FROM ai_lease_jobs WHERE status = 'RUNNING'"
            live = _count(conn, running + " AND lease_expires_at > ?", now)
            lapsed = _count(
                conn,
                "SELECT count(*) FROM ai_lease_jobs WHERE status IN ('RUNNING', 'PENDING')"
                " AND lease_expires_at <= ?",
                now,
            )
            return QueueGauges(jobs, due, later, live, lapsed)

        return await self._file._run("metrics", work)

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        info = storable_worker(info)

        def work(conn: sqlite3.Connection) -> None:
            now = self._file._clock()
            blob = orjson.dumps({**asdict(info), "last_seen": now})
            conn.execute(
                "INSERT INTO ai_lease_workers VALUES (?, ?, ?) ON CONFLICT(worker_id) DO UPDATE"
                " SET expires_at = excluded.expires_at, info = excluded.info",
                (info.worker_id, now + ttl, blob),
            )

        await self._file._run("worker_beat", work)

    async def worker_gone(self, worker_id: str) -> None:
        await self._file._run(
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
                (self._file._clock(),),
            ).fetchall()

        out = []
        for worker_id, blob in await self._file._run("list_workers", work):
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

        await self._file._write(
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
        for parts, buckets in (await self._file._run("load_durations", work)).items():
            name = "/".join(map(str, parts))[:120]
            try:
                series, counts = checked_histogram(name, parts, buckets)
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
                continue
            out[series] = counts
        return out


class SQLiteAdmin:
    """The :class:`~ai_lease.lease.admin.JobAdmin` part: retry, remove and prune."""

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file

    # -- the jobs' lifecycle for people (JobAdmin): one transaction each --------------------

    async def retry(self, key: str) -> JobState | None:
        def work(conn: sqlite3.Connection) -> JobState | None:
            now = self._file._clock()
            new, job = rules.retry(self._file._load(conn, key, now), now)
            if new is not None:
                self._file._save(conn, new)
                conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))
                conn.execute(
                    "INSERT INTO ai_lease_queue VALUES (?, ?) ON CONFLICT(key) DO UPDATE"
                    " SET due_at = excluded.due_at",
                    (key, now),
                )
            return job

        return await self._file._write("retry", work)

    async def remove(self, key: str, *, force: bool = False) -> Removal:
        def work(conn: sqlite3.Connection) -> Removal:
            now = self._file._clock()
            rec = self._file._load(conn, key, now)
            if rec is not None and not rules.removable(rec, now, force=force):
                return Removal(False, rec)
            _delete(conn, [key])
            return Removal(rec is not None, rec)

        return await self._file._write("remove", work)

    async def prune(self, older_than: float, statuses: frozenset[str] = TERMINAL_STATUSES) -> int:
        def work(conn: sqlite3.Connection) -> int:
            now = self._file._clock()
            wanted = sorted(statuses & TERMINAL_STATUSES)
            if not wanted:
                return 0
            marks = ", ".join("?" * len(wanted))
            rows = conn.execute(
                f"SELECT key FROM ai_lease_jobs WHERE status IN ({marks})", wanted
            ).fetchall()
            keys = []
            for (key,) in rows:
                rec = self._load_quietly(conn, key, now)
                if rec is not None and rules.prunable(rec, now - older_than, statuses):
                    keys.append(key)
            _delete(conn, keys)
            return len(keys)

        return await self._file._write("prune", work)

    def _load_quietly(self, conn: sqlite3.Connection, key: str, now: float) -> JobState | None:
        """A record, or None for one that is not ours (prune leaves those alone)."""
        try:
            return self._file._load(conn, key, now)
        except CorruptRecord:
            return None


def _delete(conn: sqlite3.Connection, keys: list[str]) -> None:
    """Every trace of ``keys``: the records, queue entries, recovery looks and timelines."""
    for table in ("ai_lease_jobs", "ai_lease_queue", "ai_lease_recovery", "ai_lease_timeline"):
        conn.executemany(f"DELETE FROM {table} WHERE key = ?", [(key,) for key in keys])


def _count(conn: sqlite3.Connection, sql: str, *args: object) -> int:
    return int(conn.execute(sql, args).fetchone()[0])
