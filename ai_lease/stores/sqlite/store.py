"""The embedded default store: one SQLite file in WAL mode, shared by processes on one machine.

Each operation is one ``BEGIN IMMEDIATE`` transaction that reads the record, applies the
pure rule from :mod:`ai_lease.lease.rules` and writes the result, so racing processes are
serialised by SQLite's write lock. The store's clock is this machine's clock, read inside the
transaction (stores/sqlite/file.py). A file this user cannot write is opened read-only:
``status``, ``ls`` and ``result`` work, a write fails saying why. The store is composed of
parts sharing its file: the job queue, workers, history and admin (stores/sqlite/queue.py),
the listing (stores/sqlite/listing.py) and the timeline (stores/sqlite/notes.py).

>>> store = SQLiteStore(".ai-lease/ai-lease.db")          # doctest: +SKIP
>>> outcome = await store.acquire("job-1", "node-a", ttl=30, max_no_progress=5)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink, skip_corrupt
from ai_lease.job import JobState, RunFacts, validate_key
from ai_lease.lease import rules
from ai_lease.lease.base import AcquireOutcome, Fence, Renewal, check_checkpoint
from ai_lease.lease.storable import check_owner, diagnostic, exact, ran
from ai_lease.resource import AsyncResource
from ai_lease.stores.sqlite import timeline
from ai_lease.stores.sqlite.file import SQLiteFile, unqueue
from ai_lease.stores.sqlite.listing import SQLiteListing
from ai_lease.stores.sqlite.notes import SQLiteTimeline
from ai_lease.stores.sqlite.queue import SQLiteAdmin, SQLiteQueue
from ai_lease.stores.sqlite.slots import SQLiteSlots

__all__ = ["SQLiteStore"]


class SQLiteStore(AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on one SQLite file.

    ``clock`` is the store's clock (seconds since the epoch); tests may inject one.
    ``op_timeout`` bounds how long an operation waits for another process's write lock.
    ``create=False`` (a look): a missing file is :class:`~ai_lease.errors.StoreMissing`.

    The store owns one :class:`SQLiteFile` (the connection, its thread, one transaction per
    operation) and is composed of parts that share it: ``queue`` (queue, workers, gauges,
    duration history), ``admin`` (retry / remove / prune), ``listing`` (pages and counts),
    ``timeline`` (the job's timeline and its notes) and ``slots`` (provider slots). The lease
    operations are its own methods; the parts' methods are bound onto the store, so callers
    see one object.
    """

    unschedules_ended = True
    """A commit or fail takes the job off the workers' schedule in its own transaction."""

    def __init__(
        self,
        path: str | Path,
        *,
        op_timeout: float = 2.0,
        poll_interval: float = 0.05,
        clock: Callable[[], float] = time.time,
        create: bool = True,
    ) -> None:
        self._file = file = SQLiteFile(
            path, op_timeout=op_timeout, poll_interval=poll_interval, clock=clock, create=create
        )
        self.path, self.where = file.path, file.where
        self.lost_data: None = None  # an embedded file does not lose data behind our back
        # the file's transactions, for benchmarks and tests that write beside the store
        self._run, self._write, self._save = file._run, file._write, file._save
        self.queue, self.admin = SQLiteQueue(file), SQLiteAdmin(file)
        self.listing, self.notes = SQLiteListing(file), SQLiteTimeline(file)
        queue = self.queue
        self.submit, self.due, self.reschedule = queue.submit, queue.due, queue.reschedule
        self.recover_at, self.due_recoveries = queue.recover_at, queue.due_recoveries
        self.look = queue.look
        self.worker_beat, self.worker_gone = queue.worker_beat, queue.worker_gone
        self.list_workers, self.gauges = queue.list_workers, queue.gauges
        self.add_durations, self.load_durations = queue.add_durations, queue.load_durations
        self.retry, self.remove, self.prune = self.admin.retry, self.admin.remove, self.admin.prune
        self.list_page, self.count_jobs = self.listing.list_page, self.listing.count_jobs
        self.timeline, self.note = self.notes.timeline, self.notes.note
        self.slots = slots = SQLiteSlots(file)
        self.acquire_slot, self.renew_slot = slots.acquire_slot, slots.renew_slot
        self.release_slot, self.leave_slot = slots.release_slot, slots.leave_slot
        self.slot_state, self.wait_slot = slots.slot_state, slots.wait_slot
        self.pause_slot, self.reweigh_slot = slots.pause_slot, slots.reweigh_slot

    @property
    def read_only(self) -> bool:
        """Whether the file was opened read-only (this user cannot write it)."""
        return self._file.read_only

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
        renew_interval: float | None = None,
    ) -> AcquireOutcome:
        key, owner_id = validate_key(key), check_owner(owner_id)
        return await self._file._transact(
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
                renew_interval=renew_interval,
            ),
            timeline.acquired,
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
        checkpoint: str | None = None,
    ) -> Renewal:
        check_checkpoint(fence, checkpoint)
        stage = diagnostic(stage)
        return await self._file._transact(
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
                checkpoint=checkpoint,
            ),
            lambda rec, new, answer: timeline.renewed(rec, new, answer, fence, stage),
        )

    async def release(
        self,
        fence: Fence,
        *,
        error: str | None = None,
        snapshot: str | None = None,
        interrupted: bool = False,
    ) -> bool:
        error, snapshot = diagnostic(error), diagnostic(snapshot)
        return await self._file._transact(
            "release",
            fence.key,
            lambda rec, now: rules.release(
                rec, fence, now, error=error, snapshot=snapshot, interrupted=interrupted
            ),
            lambda rec, _, done: timeline.released(rec, done, fence, error, snapshot, interrupted),
        )

    async def commit(
        self,
        fence: Fence,
        result: str,
        *,
        finish_reason: str | None = None,
        facts: RunFacts | None = None,
    ) -> JobState:
        result = exact("commit", fence.key, "result", result)
        finish_reason, facts = diagnostic(finish_reason), ran(facts)
        return await self._file._transact(
            "commit",
            fence.key,
            lambda rec, now: rules.commit(rec, fence, now, result, finish_reason, facts),
            lambda _, new, __: timeline.finished(new, fence, finish_reason or ""),
            ends=True,
        )

    async def fail(
        self, fence: Fence, reason: str, *, kind: str | None = None, facts: RunFacts | None = None
    ) -> JobState:
        reason, facts = diagnostic(reason) or "", ran(facts)
        return await self._file._transact(
            "fail",
            fence.key,
            lambda rec, now: rules.fail(rec, fence, now, reason, facts, kind),
            lambda _, new, __: timeline.finished(new, fence, reason),
            ends=True,
        )

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        stage, snapshot = diagnostic(stage), diagnostic(snapshot) or ""
        return await self._file._transact(
            "report_stall",
            fence.key,
            lambda rec, now: rules.report_stall(rec, fence, now, stage, snapshot),
            lambda _, __, done: timeline.stalled(done, fence, stage, snapshot),
        )

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        reason = diagnostic(reason) or ""

        def work(conn: sqlite3.Connection) -> JobState | None:
            now = self._file._clock()
            rec = self._file._load(conn, key, now)
            new, job = rules.cancel(rec, now, reason)
            if new is not None:
                self._file._save(conn, new)
                timeline.append(conn, key, now, timeline.cancelled(rec, new, reason))
                unqueue(conn, key)
            return job

        return await self._file._write("cancel", work)

    async def get(self, key: str) -> JobState | None:
        return await self._file._run(
            "get", lambda conn: self._file._load(conn, key, self._file._clock())
        )

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        def work(conn: sqlite3.Connection) -> list[JobState | CorruptRecord]:
            where, args = ("WHERE status = ?", [status]) if status else ("", [])
            rows = conn.execute(
                f"SELECT key FROM ai_lease_jobs {where} ORDER BY rowid DESC LIMIT ?",
                [*args, limit],
            ).fetchall()
            now = self._file._clock()
            return [job for (key,) in rows if (job := self._load_or_corrupt(conn, key, now))]

        jobs = []
        for job in await self._file._run("list_jobs", work):
            if isinstance(job, CorruptRecord):
                skip_corrupt(job, on_corrupt)
            else:
                jobs.append(job)
        return jobs

    def _load_or_corrupt(
        self, conn: sqlite3.Connection, key: str, now: float
    ) -> JobState | CorruptRecord | None:
        try:
            return self._file._load(conn, key, now)
        except CorruptRecord as exc:  # reported on the event loop's side, by the caller
            return exc

    async def wait(self, key: str, timeout: float) -> None:
        """Return when the job's record changes, or after ``timeout`` seconds (polling)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first = await self._file._run("wait", lambda conn: _version(conn, key))
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(self._file._poll, left))
            if await self._file._run("wait", lambda conn: _version(conn, key)) != first:
                return

    async def data_lost(self) -> None:
        """Always None: an embedded file does not lose data behind its users' backs."""
        return None

    async def aclose(self) -> None:
        await self._file.aclose()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"


def _version(conn: sqlite3.Connection, key: str) -> Any:
    return conn.execute(
        "SELECT status, lease_expires_at, length(record) FROM ai_lease_jobs WHERE key = ?", (key,)
    ).fetchone()
