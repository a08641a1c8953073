"""The embedded default store: one SQLite file in WAL mode, shared by processes on one machine.

Each operation is one ``BEGIN IMMEDIATE`` transaction that reads the record, applies the
pure rule from :mod:`ai_lease.lease.rules` and writes the result, so racing processes are
serialised by SQLite's write lock. The store's clock is this machine's clock, read inside the
transaction (stores/sqlite/file.py). A file this user cannot write is opened read-only:
``status``, ``ls`` and ``result`` work, a write fails saying why. The job queue, workers and
history are in stores/sqlite/queue.py.

>>> store = SQLiteStore(".ai-lease/ai-lease.db")          # doctest: +SKIP
>>> outcome = await store.acquire("job-1", "node-a", ttl=30, max_no_progress=5)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink, skip_corrupt
from ai_lease.job import JobState, RunFacts, validate_key
from ai_lease.lease import rules
from ai_lease.lease.base import AcquireOutcome, Fence, Renewal, check_checkpoint
from ai_lease.lease.storable import check_owner, diagnostic, exact, ran
from ai_lease.lease.timeline import check_note
from ai_lease.resource import AsyncResource
from ai_lease.stores.sqlite import timeline
from ai_lease.stores.sqlite.listing import SQLiteListing
from ai_lease.stores.sqlite.queue import SQLiteQueue

__all__ = ["SQLiteStore"]


class SQLiteStore(SQLiteListing, SQLiteQueue, AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on one SQLite file.

    ``clock`` is the store's clock (seconds since the epoch); tests may inject one.
    ``op_timeout`` bounds how long an operation waits for another process's write lock.
    """

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
        return await self._transact(
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
        return await self._transact(
            "commit",
            fence.key,
            lambda rec, now: rules.commit(rec, fence, now, result, finish_reason, facts),
            lambda _, new, __: timeline.finished(new, fence, finish_reason or ""),
        )

    async def fail(
        self, fence: Fence, reason: str, *, kind: str | None = None, facts: RunFacts | None = None
    ) -> JobState:
        reason, facts = diagnostic(reason) or "", ran(facts)
        return await self._transact(
            "fail",
            fence.key,
            lambda rec, now: rules.fail(rec, fence, now, reason, facts, kind),
            lambda _, new, __: timeline.finished(new, fence, reason),
        )

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        stage, snapshot = diagnostic(stage), diagnostic(snapshot) or ""
        return await self._transact(
            "report_stall",
            fence.key,
            lambda rec, now: rules.report_stall(rec, fence, now, stage, snapshot),
            lambda _, __, done: timeline.stalled(done, fence, stage, snapshot),
        )

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        reason = diagnostic(reason) or ""

        def work(conn: sqlite3.Connection) -> JobState | None:
            now = self._clock()
            rec = self._load(conn, key, now)
            new, job = rules.cancel(rec, now, reason)
            if new is not None:
                self._save(conn, new)
                timeline.append(conn, key, now, timeline.cancelled(rec, new, reason))
                conn.execute("DELETE FROM ai_lease_queue WHERE key = ?", (key,))
                conn.execute("DELETE FROM ai_lease_recovery WHERE key = ?", (key,))
            return job

        return await self._write("cancel", work)

    async def note(
        self,
        key: str,
        kind: str,
        detail: str,
        *,
        owner_id: str,
        token: int,
        stage: str | None = None,
    ) -> bool:
        """One entry in an existing job's timeline (:class:`~ai_lease.lease.timeline.JobNotes`)."""
        detail = check_note(kind, detail)
        owner_id, stage = diagnostic(owner_id) or "", diagnostic(stage)

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute("SELECT 1 FROM ai_lease_jobs WHERE key = ?", (key,)).fetchone() is None:
                return False
            entry = (kind, owner_id, token, stage or "", detail)
            timeline.append(conn, key, self._clock(), entry)
            return True

        return await self._write("note", work)

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

    async def wait(self, key: str, timeout: float) -> None:
        """Return when the job's record changes, or after ``timeout`` seconds (polling)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first = await self._run("wait", lambda conn: _version(conn, key))
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(self._poll, left))
            if await self._run("wait", lambda conn: _version(conn, key)) != first:
                return

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r})"


def _version(conn: sqlite3.Connection, key: str) -> Any:
    return conn.execute(
        "SELECT status, lease_expires_at, length(record) FROM ai_lease_jobs WHERE key = ?", (key,)
    ).fetchone()
