"""The SQLite store's file: its connection, its schema and one transaction per operation.

All SQLite work runs on one thread per store, keeping the event loop free while another
process holds the write lock (closing too). Writes that arrive while that thread is busy
are committed together (a group commit): one ``BEGIN IMMEDIATE`` ... ``COMMIT`` around
them; a write that raises is rolled back and the others run again without it, so each one
still applies whole or not at all, and none is answered before the ``COMMIT`` that holds
it. A file this user cannot write is opened read-only: reads work, a write fails saying
why. The store owns one :class:`SQLiteFile` and hands it to each of its parts (queue,
admin, listing, timeline in :mod:`ai_lease.stores.sqlite.queue`,
:mod:`~ai_lease.stores.sqlite.listing` and :mod:`~ai_lease.stores.sqlite.notes`), so they
share one connection and one thread.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from ai_lease.errors import CorruptRecord, FencingRejected, StoreMissing, StoreUnavailable
from ai_lease.failure import stored_error
from ai_lease.job import JobState
from ai_lease.lease.listing import created_us
from ai_lease.retry import while_locked
from ai_lease.stores.sqlite import timeline
from ai_lease.stores.sqlite.migrate import migrate

__all__ = ["SQLiteFile", "unqueue"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ai_lease_jobs (
    key TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    lease_expires_at REAL,
    record BLOB NOT NULL,
    created_us INTEGER NOT NULL DEFAULT 0
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
CREATE TABLE IF NOT EXISTS ai_lease_timeline (
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    token INTEGER NOT NULL,
    stage TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ai_lease_workers (
    worker_id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    info BLOB NOT NULL
);
-- Provider slots (stores/sqlite/slots.py): holders (each its weight: units of a weighted
-- limit), the waiting line, each limit's counter, and when a paused limit grants again.
CREATE TABLE IF NOT EXISTS ai_lease_slots (limit_name TEXT NOT NULL, owner_id TEXT NOT NULL,
    token INTEGER NOT NULL, expires_at REAL NOT NULL, weight INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (limit_name, owner_id));
CREATE TABLE IF NOT EXISTS ai_lease_slot_waiters (limit_name TEXT NOT NULL,
    owner_id TEXT NOT NULL, priority INTEGER NOT NULL, seq INTEGER NOT NULL,
    expires_at REAL NOT NULL, PRIMARY KEY (limit_name, owner_id));
CREATE TABLE IF NOT EXISTS ai_lease_slot_limits (limit_name TEXT PRIMARY KEY, last INTEGER);
CREATE TABLE IF NOT EXISTS ai_lease_slot_pauses (limit_name TEXT PRIMARY KEY,
    until REAL NOT NULL);
"""


# The listing's indexes (stores/sqlite/listing.py): pages newest first, with or without a
# status. Made after migrate (stores/sqlite/migrate.py), which gives a file from before them
# its created_us column.
_LISTING_SCHEMA = """
CREATE INDEX IF NOT EXISTS ai_lease_jobs_by_created ON ai_lease_jobs (created_us, key);
CREATE INDEX IF NOT EXISTS ai_lease_jobs_by_status_created
    ON ai_lease_jobs (status, created_us, key);
"""

# The jobs' columns the indexes read (the record's own fields, kept beside it).
_INDEXED = ("status", "lease_expires_at", "created_us")


def unqueue(conn: sqlite3.Connection, key: str) -> None:
    """Take ``key`` off the workers' schedule: its queue entry and its recovery look."""
    conn.execute("DELETE FROM ai_lease_queue WHERE key = ?", (key,))
    conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))


class SQLiteFile:
    """One SQLite file in WAL mode, and the transactions the store runs on it.

    ``clock`` is the store's clock (seconds since the epoch); tests may inject one.
    ``op_timeout`` bounds how long an operation waits for another process's write lock.
    ``create=False`` (a look): a file that does not exist is :class:`StoreMissing` at the
    first operation, never made.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        op_timeout: float = 2.0,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self.path, self._create = str(path), create
        self.where = f"sqlite:///{self.path}"
        self._op_timeout, self._poll, self._clock = op_timeout, poll_interval, clock
        self._conn: sqlite3.Connection | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ai-lease-sqlite")
        # writes waiting for the thread, and whether a group commit is queued to take them
        self._pending: list[_Write] = []
        self._pending_lock, self._drain_queued = threading.Lock(), False
        self.read_only = False
        self.lost_data: None = None  # an embedded file does not lose data behind our back

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None and self._not_writable():
            self._conn, self.read_only = self._open_read_only(), True
        if self._conn is None:
            if not self._create and self.path != ":memory:" and not os.path.exists(self.path):
                at = f"{Path(self.path).absolute()} ({self.where})"
                raise StoreMissing(self.where, f"no store at {at}; `ai-lease submit` creates it")
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self._op_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            if not self._create and self.path != ":memory:" and not _holds_a_store(conn):
                conn.close()  # a file that is not (yet) a store: a look leaves it as it was
                at = f"{Path(self.path).absolute()} ({self.where})"
                raise StoreMissing(
                    self.where, f"{at} holds no ai_lease store; `ai-lease submit` creates it"
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

        def once() -> None:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            migrate(conn)
            conn.executescript(_LISTING_SCHEMA)

        try:
            while_locked(once, self._op_timeout)
        except sqlite3.OperationalError:
            conn.close()
            raise

    async def _run(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, lambda: fn(self._connect()))
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(op, exc) from exc

    def _unavailable(self, op: str, exc: sqlite3.Error | OSError) -> StoreUnavailable:
        """A failed statement or transaction is rolled back: nothing was applied."""
        detail = str(exc)
        if self.read_only and "readonly" in detail:
            detail = (
                f"the file is not writable by this user, so it was opened read-only: {op} "
                "needs write access (make the file and its directory writable)"
            )
        return StoreUnavailable(self.where, op, detail, maybe_applied=False)

    def _load(self, conn: sqlite3.Connection, key: str, now: float) -> JobState | None:
        row = conn.execute("SELECT record FROM ai_lease_jobs WHERE key = ?", (key,)).fetchone()
        return None if row is None else self._decode(key, row[0], now)

    def _load_row(
        self, conn: sqlite3.Connection, key: str, now: float
    ) -> tuple[JobState | None, tuple[Any, ...] | None, int]:
        """In one read: the record, its row's indexed columns as stored (:data:`_INDEXED`;
        None without a row) and the last ``seq`` of its timeline (0 for none)."""
        blob, *stored, last = conn.execute(
            "SELECT j.record, j.status, j.lease_expires_at, j.created_us,"
            " (SELECT max(seq) FROM ai_lease_timeline WHERE key = ?1)"
            " FROM (SELECT 1) LEFT JOIN ai_lease_jobs j ON j.key = ?1",
            (key,),
        ).fetchone()
        if blob is None:
            return None, None, last or 0
        return self._decode(key, blob, now), tuple(stored), last or 0

    @staticmethod
    def _decode(key: str, blob: bytes, now: float) -> JobState:
        """A stored record as a job read at ``now`` (:class:`CorruptRecord` if not ours)."""
        try:
            data = orjson.loads(blob)
        except orjson.JSONDecodeError:
            raise CorruptRecord(key, "record is not JSON") from None
        if not isinstance(data, dict) or data.get("schema") != 1:
            raise CorruptRecord(key, "record has no ai_lease schema marker")
        return JobState.from_fields(key, data, now)

    @staticmethod
    def _save(
        conn: sqlite3.Connection, job: JobState, stored: tuple[Any, ...] | None = None
    ) -> None:
        """Write ``job``'s record. ``stored``: its row's indexed columns as read in this
        transaction, so only those that changed are set (an index whose columns are set is
        rewritten, changed or not: pages written, and checkpointed, for nothing)."""
        data = job.to_dict()
        del data["key"], data["read_at"]
        # A given-up record keeps the code and the last error, not the sentence readers see.
        data["last_error"] = stored_error(job.failure_kind, job.attempts, job.last_error)
        data["schema"] = 1
        blob, created = orjson.dumps(data), created_us(job.created_at)
        if stored is not None:
            values = (job.status.value, job.lease_expires_at, created)
            changed = [
                (c, v) for c, v, old in zip(_INDEXED, values, stored, strict=True) if v != old
            ]
            sets = "".join(f", {column} = ?" for column, _ in changed)
            args = (blob, *(value for _, value in changed), job.key)
            conn.execute(f"UPDATE ai_lease_jobs SET record = ?{sets} WHERE key = ?", args)
            return
        conn.execute(
            "INSERT INTO ai_lease_jobs (key, status, lease_expires_at, record, created_us)"
            " VALUES (?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET status = excluded.status,"
            " lease_expires_at = excluded.lease_expires_at, record = excluded.record,"
            " created_us = excluded.created_us",
            (job.key, job.status.value, job.lease_expires_at, blob, created),
        )

    async def _write(self, op: str, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in a write transaction (``BEGIN IMMEDIATE``: processes queue here),
        answered once it is committed. Writes queued while the thread is busy share one
        transaction (:meth:`_drain`)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        with self._pending_lock:
            self._pending.append((fn, answer))
            queue_drain, self._drain_queued = not self._drain_queued, True
        if queue_drain:
            try:
                drained = loop.run_in_executor(self._executor, self._drain)
            except BaseException:  # a closed store: leave no write waiting for a thread
                with self._pending_lock:
                    self._pending, self._drain_queued = [], False
                raise
            drained.add_done_callback(_deliver)
        try:
            return await answer
        except (sqlite3.Error, OSError) as exc:
            raise self._unavailable(op, exc) from exc

    def _drain(self) -> list[_Outcome]:
        """On the store's thread: every write queued so far (but those whose caller gave up
        before it ran), in one transaction; each write's answer or error. A write that raises
        rolls the transaction back and the others run again without it (rare: a refusal that
        raises, or a bug), so each write still applies whole or not at all."""
        with self._pending_lock:
            batch, self._pending, self._drain_queued = self._pending, [], False
        batch = [(fn, answer) for fn, answer in batch if not answer.cancelled()]
        failed: list[_Outcome] = []
        conn: sqlite3.Connection | None = None
        try:
            while batch:
                conn = self._connect()
                conn.execute("BEGIN IMMEDIATE")
                done, index, error = _each(conn, batch)
                if error is None:
                    conn.execute("COMMIT")
                    return failed + done
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                failed.append((batch[index][1], False, error))
                batch = batch[:index] + batch[index + 1 :]
        except BaseException as exc:  # nothing of this transaction was applied
            if conn is not None and conn.in_transaction:
                conn.execute("ROLLBACK")
            return failed + [(answer, False, exc) for _, answer in batch]
        return failed

    async def _transact(
        self,
        op: str,
        key: str,
        rule: Callable[[JobState | None, float], tuple[JobState | None, T]],
        note: Callable[[JobState | None, JobState | None, T], timeline.Note | None] | None = None,
        *,
        ends: bool = False,
    ) -> T:
        """Read, decide and write one job's record in one write transaction, noting in the
        job's timeline what ``note`` makes of it (the record before, after, the answer); a
        fenced write the rule rejects is noted too, in the same transaction. ``ends``: a
        record written takes the job off the workers' schedule (a commit, a fail)."""

        def work(conn: sqlite3.Connection) -> T | FencingRejected:
            now = self._clock()
            rec, stored, last = self._load_row(conn, key, now)
            try:
                new, answer = rule(rec, now)
            except FencingRejected as exc:
                timeline.append(conn, key, now, timeline.rejected(rec, exc), last)
                return exc
            if new is not None:
                self._save(conn, new, stored)
                if ends:
                    unqueue(conn, key)
            if note is not None:
                timeline.append(conn, key, now, note(rec, new, answer), last)
            return answer

        answer = await self._write(op, work)
        if isinstance(answer, FencingRejected):
            raise answer
        return answer

    async def aclose(self) -> None:
        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, close)
        # Work queued behind the close may still run (seconds, on a held write lock):
        # wait for it off the event loop.
        await asyncio.to_thread(self._executor.shutdown, wait=True)


_Write = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]"]
_Outcome = tuple["asyncio.Future[Any]", bool, Any]
"""A write's future, whether it succeeded, and its answer (or its error)."""


def _each(
    conn: sqlite3.Connection, batch: list[_Write]
) -> tuple[list[_Outcome], int, Exception | None]:
    """Run the writes in order in the open transaction: their answers, or where the first
    one that raised stands and what it raised (the caller rolls back)."""
    done: list[_Outcome] = []
    for index, (fn, answer) in enumerate(batch):
        try:
            done.append((answer, True, fn(conn)))
        except Exception as exc:
            return done, index, exc
    return done, len(batch), None


def _deliver(drained: asyncio.Future[list[_Outcome]]) -> None:
    """On the event loop: hand each write of a group commit its answer or its error."""
    for answer, ok, value in drained.result():
        if answer.done():  # its caller gave up while it ran
            continue
        if ok:
            answer.set_result(value)
        else:
            answer.set_exception(value)


def _holds_a_store(conn: sqlite3.Connection) -> bool:
    """Whether the file behind ``conn`` already has the store's jobs table (read only)."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ai_lease_jobs'"
    ).fetchone()
    return row is not None
