"""The PostgreSQL store's job queue, workers, duration history and admin: one call each.

The queue is a table of "look again at" times beside the jobs (plus the recovery looks
asked for first); workers and duration buckets have a table each. Every operation is one
statement, most a call of a function in stores/postgres/queue_sql.py. The schedule is a hint
that workers correct, never the judge: ``due`` claims the keys it hands out with ``FOR
UPDATE SKIP LOCKED`` and hides them from other stores for :data:`CLAIM_HOLD` seconds, so
workers asking at the same instant look at different jobs, and the lease still decides who
runs one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import orjson

from ai_lease.errors import CorruptRecord, CorruptSink, JobConflict, skip_corrupt
from ai_lease.job import JobState, Status
from ai_lease.lease.admin import TERMINAL_STATUSES, Removal
from ai_lease.lease.histogram import checked_histogram
from ai_lease.lease.queue import QueueGauges, WorkerInfo, storable_worker
from ai_lease.lease.storable import exact
from ai_lease.stores.postgres.conn import PostgresConn, job_key
from ai_lease.stores.postgres.schema import JOB_COLUMNS

__all__ = ["CLAIM_HOLD", "PRUNE_BATCH", "PostgresAdmin", "PostgresQueue"]

CLAIM_HOLD = 0.1
"""Seconds a key ``due`` handed out stays hidden from other stores (unless rescheduled):
long enough for the worker that got it to acquire it and move its entry, short enough that
a key it did not take is soon due for the others again."""

PRUNE_BATCH = 500
"""Jobs one prune call deletes at most (one statement each, bounded by ``op_timeout``)."""

_COUNTS = (
    "WITH t AS (SELECT extract(epoch FROM clock_timestamp())::double precision AS now)"
    " SELECT (SELECT json_object_agg(status, n)::text FROM (SELECT status, count(*) AS n"
    " FROM {schema}.ail_jobs GROUP BY status) s),"
    " (SELECT count(*) FROM {schema}.ail_queue, t WHERE due_at <= t.now),"
    " (SELECT count(*) FROM {schema}.ail_queue, t WHERE due_at > t.now),"
    " (SELECT count(*) FROM {schema}.ail_jobs, t"
    " WHERE status = 'RUNNING' AND lease_expires_at > t.now),"
    " (SELECT count(*) FROM {schema}.ail_jobs, t"
    " WHERE status IN ('RUNNING', 'PENDING') AND lease_expires_at <= t.now)"
)

JOB = ", ".join(f"(o_job).{name}" for name in JOB_COLUMNS)
"""The columns of a function's ``o_job`` result, in :data:`JOB_COLUMNS` order."""


class PostgresQueue:
    """The :class:`~ai_lease.lease.queue.JobQueue` part of the PostgreSQL store, and its
    history."""

    def __init__(self, conn: PostgresConn) -> None:
        self._conn = conn
        self._claims: dict[str, tuple[float, float]] | None = None  # see _live_claims

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        row = await self._conn._fetchone(
            "submit",
            f"SELECT o_outcome, o_now, {JOB} FROM {{schema}}.ail_submit(%s, %s, %s)",
            (job_key(key), exact("submit", key, "spec", spec, nul=False), fingerprint),
        )
        if row is None or row[0] == "conflict":
            raise JobConflict(key)
        job = self._conn._job(row[2:], row[1])
        if row[0] == "corrupt":  # _job found nothing wrong: the status is still unknown
            raise CorruptRecord(key, f"field 'status' holds {str(job.status)[:40]!r}")
        return job

    async def due(self, limit: int) -> list[str]:
        """Lapsed leases with a queue entry first (the earliest lapse first), then the due
        entries; each claimed for :data:`CLAIM_HOLD` seconds. This store's own claims it
        still sees as due until their hold ends (so a worker never loses sight of a key it
        passed over), others' it does not."""
        if limit <= 0:
            return []
        mine = self._live_claims()
        rows = await self._conn._fetch(
            "due",
            "SELECT o_key, o_claimed FROM {schema}.ail_due(%s, %s, %s, %s)",
            (limit, CLAIM_HOLD, list(mine), [at for at, _ in mine.values()]),
        )
        now = time.monotonic()
        for key, claimed in rows:
            if claimed is not None:
                mine[key] = (claimed, now)
        return [key for key, _ in rows]

    def _live_claims(self) -> dict[str, tuple[float, float]]:
        """This store's claims (key -> the ``due_at`` it set, and when it heard so) whose
        hold may not have ended: one heard longer than :data:`CLAIM_HOLD` ago ended on the
        server too (the server set it before). A key rescheduled since no longer matches
        its ``due_at``, so an entry kept too long costs a lookup, never a wrong answer."""
        if self._claims is None:
            self._claims = {}
        cutoff = time.monotonic() - CLAIM_HOLD
        if any(heard < cutoff for _, heard in self._claims.values()):
            self._claims = {k: v for k, v in self._claims.items() if v[1] >= cutoff}
        return self._claims

    async def reschedule(self, key: str, at: float | None) -> None:
        await self._conn._fetch(
            "reschedule",
            "SELECT {schema}.ail_reschedule(%s, %s)",
            (job_key(key), None if at is None else float(at)),
        )

    async def look(self, key: str, ttl: float) -> JobState | None:
        """A worker's look (:func:`~ai_lease.lease.queue.look_at`): the job, and its queue
        entry moved by :func:`~ai_lease.lease.queue.next_look`, in one statement."""
        row = await self._conn._fetchone(
            "look", f"SELECT o_now, {JOB} FROM {{schema}}.ail_look(%s, %s)", (job_key(key), ttl)
        )
        return None if row is None else self._conn._job(row[1:], row[0])

    async def recover_at(self, key: str, at: float) -> None:
        await self._conn._fetch(
            "recover_at", "SELECT {schema}.ail_recover_at(%s, %s)", (job_key(key), float(at))
        )

    async def due_recoveries(self, limit: int) -> list[str]:
        rows = await self._conn._fetch(
            "due_recoveries",
            "SELECT key FROM {schema}.ail_recovery"
            " WHERE due_at <= extract(epoch FROM clock_timestamp())"
            " ORDER BY due_at, key LIMIT %s",
            (limit,),
        )
        return [key for (key,) in rows]

    async def gauges(self) -> QueueGauges:
        """What the store-wide gauges read, in one statement off the indexes: jobs per
        status, queue entries due and later (a claimed entry counts as scheduled for its
        hold), live and lapsed leases (lapsed or handed back, not taken again)."""
        row = await self._conn._fetchone("metrics", _COUNTS) or (None, 0, 0, 0, 0)
        counted = orjson.loads(row[0]) if row[0] else {}
        jobs = {s.value: int(counted.get(s.value, 0)) for s in Status}
        due, later, live, lapsed = (int(n) for n in row[1:])
        return QueueGauges(jobs, due, later, live, lapsed)

    # -- workers ---------------------------------------------------------------------------

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        info = storable_worker(info)
        blob = orjson.dumps({k: v for k, v in asdict(info).items() if k != "last_seen"})
        await self._conn._fetch(
            "worker_beat",
            "SELECT {schema}.ail_worker_beat(%s, %s, %s)",
            (info.worker_id, blob.decode(), float(ttl)),
        )

    async def worker_gone(self, worker_id: str) -> None:
        await self._conn._fetch(
            "worker_gone",
            "DELETE FROM {schema}.ail_workers WHERE worker_id = %s RETURNING worker_id",
            (worker_id,),
        )

    async def list_workers(self, *, on_corrupt: CorruptSink | None = None) -> list[WorkerInfo]:
        rows = await self._conn._fetch(
            "list_workers",
            "SELECT worker_id, info FROM {schema}.ail_workers"
            " WHERE expires_at > extract(epoch FROM clock_timestamp()) ORDER BY worker_id",
        )
        out = []
        for worker_id, blob in rows:
            try:
                out.append(WorkerInfo.from_json(str(worker_id), blob))
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
        return out

    # -- duration history ------------------------------------------------------------------

    async def add_durations(self, counts: Mapping[tuple[str, str, str], Mapping[int, int]]) -> None:
        rows = sorted(
            (*series, int(bucket), int(n))
            for series, buckets in counts.items()
            for bucket, n in buckets.items()
        )
        if not rows:
            return
        columns: list[Sequence[Any]] = [list(column) for column in zip(*rows, strict=True)]
        await self._conn._fetch(
            "add_durations",
            "SELECT {schema}.ail_add_durations(%s, %s, %s, %s::int[], %s::bigint[])",
            columns,
            resend=False,  # adds to the counts: sent twice, they would count twice
        )

    async def load_durations(
        self, *, on_corrupt: CorruptSink | None = None
    ) -> dict[tuple[str, str, str], dict[int, int]]:
        rows = await self._conn._fetch(
            "load_durations",
            "SELECT pipeline, kind, stage, bucket, count FROM {schema}.ail_durations",
        )
        grouped: dict[tuple[Any, ...], list[tuple[Any, Any]]] = {}
        for pipeline, kind, stage, bucket, n in rows:
            grouped.setdefault((pipeline, kind, stage), []).append((bucket, n))
        out: dict[tuple[str, str, str], dict[int, int]] = {}
        for parts, buckets in grouped.items():
            try:
                series, counted = checked_histogram("/".join(map(str, parts))[:120], parts, buckets)
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
                continue
            out[series] = counted
        return out


class PostgresAdmin:
    """The :class:`~ai_lease.lease.admin.JobAdmin` part: retry, remove and prune."""

    def __init__(self, conn: PostgresConn) -> None:
        self._conn = conn

    # -- the jobs' lifecycle for people (JobAdmin): one function call each -----------------

    async def retry(self, key: str) -> JobState | None:
        row = await self._conn._fetchone(
            "retry", f"SELECT o_now, {JOB} FROM {{schema}}.ail_retry(%s)", (job_key(key),)
        )
        if row is None or row[1] is None:
            return None
        return self._conn._job(row[1:], row[0])

    async def remove(self, key: str, *, force: bool = False) -> Removal:
        """Delete the job (see :func:`~ai_lease.lease.rules.removable`); a record that is
        not ours raises :class:`CorruptRecord` and stays."""
        row = await self._conn._fetchone(
            "remove",
            f"SELECT o_outcome, o_now, {JOB} FROM {{schema}}.ail_remove(%s, %s)",
            (job_key(key), force),
        )
        if row is None or row[0] == "gone":
            return Removal(False, None)
        job = self._conn._job(row[2:], row[1])
        if row[0] == "corrupt":  # _job found nothing wrong: the status is still unknown
            raise CorruptRecord(key, f"field 'status' holds {str(job.status)[:40]!r}")
        return Removal(row[0] == "removed", job)

    async def prune(self, older_than: float, statuses: frozenset[str] = TERMINAL_STATUSES) -> int:
        """Batches of :data:`PRUNE_BATCH`, one statement each, until a batch comes up short:
        for people, not hot paths."""
        wanted = sorted(statuses & TERMINAL_STATUSES)
        if not wanted:
            return 0
        removed = 0
        while True:
            row = await self._conn._fetchone(
                "prune",
                "SELECT {schema}.ail_prune(%s, %s, %s)",
                (float(older_than), wanted, PRUNE_BATCH),
            )
            n = int(row[0]) if row is not None else 0
            removed += n
            if n < PRUNE_BATCH:
                return removed
