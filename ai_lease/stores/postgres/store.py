"""The PostgreSQL store: leases, fencing and the queue on a database teams already run.

Every lease operation is one round trip: one ``SELECT`` of a plpgsql function
(stores/postgres/lease_sql.py) that locks the job's row, judges by the database's clock, writes
the record and its timeline entry and, when a lease or a job ends, NOTIFYs its followers —
one transaction. A committed result is as durable as the database makes it: with a
synchronous standby, a failover does not lose an acknowledged commit. Fencing tokens come
from a sequence (WAL-logged), so they keep increasing across restarts and promotions.
Followers wait on LISTEN/NOTIFY through one listening connection per store
(stores/postgres/notify.py). The connection layer is stores/postgres/conn.py, the schema and
its migration stores/postgres/schema.py. The store is composed of parts sharing its
connection: the job queue, workers, history and admin (stores/postgres/queue.py), the
listing (stores/postgres/listing.py), the timeline (stores/postgres/notes.py) and provider
slots (stores/postgres/slots.py).

>>> store = PostgresStore.from_url("postgresql://app@db:5432/jobs")   # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.failure import kept_kind
from ai_lease.job import JobState, RunFacts
from ai_lease.lease.base import (
    Acquired,
    AcquireOutcome,
    Fence,
    Finished,
    Following,
    Renewal,
    check_checkpoint,
)
from ai_lease.lease.rules import clip
from ai_lease.lease.storable import check_owner, diagnostic, exact, ran
from ai_lease.refusal import Refusal
from ai_lease.resource import AsyncResource
from ai_lease.stores.postgres.conn import PostgresConn, check_url, job_key
from ai_lease.stores.postgres.listing import PostgresListing
from ai_lease.stores.postgres.notes import PostgresTimeline
from ai_lease.stores.postgres.notify import Listener
from ai_lease.stores.postgres.queue import PostgresAdmin, PostgresQueue
from ai_lease.stores.postgres.schema import channel_name
from ai_lease.stores.postgres.slots import WAKE, PostgresSlots

__all__ = ["PostgresStore"]

_ACQUIRE = (
    "SELECT a.o_kind, a.o_at, a.o_taken, a.o_cause, (a.o_job).*"
    " FROM {schema}.ail_acquire(%s, %s, %s, %s, %s, %s, %s, %s) a"
)
_RENEW = "SELECT * FROM {schema}.ail_renew(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_RELEASE = "SELECT {schema}.ail_release(%s, %s, %s, %s, %s, %s)"
_FINISH = (
    "SELECT f.o_kind, f.o_at, f.o_code, f.o_token, f.o_owner, (f.o_job).* FROM"
    " {schema}.ail_finish(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) f"
)
_STALL = "SELECT {schema}.ail_report_stall(%s, %s, %s, %s, %s)"
_CANCEL = "SELECT c.o_at, (c.o_job).* FROM {schema}.ail_cancel(%s, %s) c"
_GET = (
    "SELECT extract(epoch FROM clock_timestamp())::double precision, j.*"
    " FROM {schema}.ail_jobs j WHERE j.key = %s"
)
_VERSION = "SELECT status, token, updated_at FROM {schema}.ail_jobs WHERE key = %s"


class PostgresStore(AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on PostgreSQL (psycopg 3, async).

    Everything lives in the PostgreSQL schema named after ``namespace``; ``from_url`` opens
    one without I/O, and the first call applies the migration unless it is there.

    The store owns one :class:`PostgresConn` (the pool, the bounded calls, the record
    decoding) and is composed of parts that share it: ``queue`` (queue, workers, gauges,
    duration history), ``admin`` (retry / remove / prune), ``listing`` (whole lists, pages
    and counts), ``notes`` (the job's timeline and its notes) and ``slots`` (provider
    slots). The lease operations and followers' waits are its own methods; the parts'
    methods are bound onto the store, so callers see one object.
    """

    unschedules_ended = True
    """A commit or fail takes the job off the workers' schedule in its own transaction."""

    def __init__(self, conninfo: str, **kw: Any) -> None:
        self._conn = conn = PostgresConn(conninfo, **kw)
        self.where, self.namespace, self.schema = conn.where, conn.namespace, conn.schema
        self.migrate = conn.migrate
        self._fetch = conn._fetch  # for tests that write beside the store
        self.queue, self.admin = PostgresQueue(conn), PostgresAdmin(conn)
        self.listing, self.notes = PostgresListing(conn), PostgresTimeline(conn)
        queue = self.queue
        self.submit, self.due, self.reschedule = queue.submit, queue.due, queue.reschedule
        self.recover_at, self.due_recoveries = queue.recover_at, queue.due_recoveries
        self.look = queue.look
        self.worker_beat, self.worker_gone = queue.worker_beat, queue.worker_gone
        self.list_workers, self.gauges = queue.list_workers, queue.gauges
        self.add_durations, self.load_durations = queue.add_durations, queue.load_durations
        self.retry, self.remove, self.prune = self.admin.retry, self.admin.remove, self.admin.prune
        self.list_jobs = self.listing.list_jobs
        self.list_page, self.count_jobs = self.listing.list_page, self.listing.count_jobs
        self.timeline, self.note = self.notes.timeline, self.notes.note
        self._listener = Listener(
            channel_name(conn.namespace),
            lambda: conn._connect("wait"),
            self._version,
            poll_interval=conn._poll,
            ready_timeout=conn._op_timeout,
        )
        self.slots = slots = PostgresSlots(conn, self._listener)
        self.acquire_slot, self.renew_slot = slots.acquire_slot, slots.renew_slot
        self.release_slot, self.leave_slot = slots.release_slot, slots.leave_slot
        self.slot_state, self.wait_slot = slots.slot_state, slots.wait_slot
        self.pause_slot, self.reweigh_slot = slots.pause_slot, slots.reweigh_slot

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        poll_interval: float = 0.05,
        create: bool = True,
    ) -> PostgresStore:
        check_url(url)
        return cls(
            url,
            namespace=namespace,
            op_timeout=op_timeout,
            poll_interval=poll_interval,
            create=create,
        )

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
        owner_id = check_owner(owner_id)
        args = (job_key(key), owner_id, ttl, max_no_progress, stall_policy, fingerprint or "")
        row = await self._conn._fetchone("acquire", _ACQUIRE, (*args, max_attempts, renew_interval))
        if row is None:  # a function that returns one row always does
            raise JobConflict(key)
        kind, now, taken, cause = row[:4]
        if kind == "conflict":
            raise JobConflict(key)
        job = self._conn._job(row[4:], now)
        if kind == "acquired":
            return Acquired(Fence(key, owner_id, job.token), bool(taken), job, cause)
        return Following(job) if kind == "following" else Finished(job)

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
        check_checkpoint(fence, checkpoint, nul=False)
        stage = diagnostic(stage)
        args = (job_key(fence.key), fence.owner_id, fence.token, ttl, stage, progress_version)
        row = await self._conn._fetchone(
            "renew", _RENEW, (*args, max_no_progress, grace, checkpoint)
        )
        assert row is not None  # one row, always
        code, remaining, token, owner, stalled = row
        if code == "ok":
            return Renewal(True, None, float(remaining), stalled=bool(stalled))
        current = None if token is None else Fence(fence.key, owner or "", int(token))
        return Renewal(False, Refusal(code), float(remaining), current=current)

    async def release(
        self,
        fence: Fence,
        *,
        error: str | None = None,
        snapshot: str | None = None,
        interrupted: bool = False,
    ) -> bool:
        key = job_key(fence.key)
        args = (key, fence.owner_id, fence.token, clip(error), clip(snapshot), interrupted)
        row = await self._conn._fetchone("release", _RELEASE, args)
        return bool(row and row[0])

    async def _finish(
        self,
        op: str,
        fence: Fence,
        status: str,
        value: str,
        reason: str | None = None,
        facts: RunFacts | None = None,
        kind: str | None = None,
    ) -> JobState:
        args = (job_key(fence.key), fence.owner_id, fence.token, status, value, reason or "")
        row = await self._conn._fetchone(op, _FINISH, (*args, *_facts_args(ran(facts)), kind))
        assert row is not None  # one row, always
        kind, now, code, token, owner = row[:5]
        if kind == "rejected":
            current = None if owner is None else Fence(fence.key, owner, int(token))
            raise FencingRejected(fence.key, fence, current, Refusal(code))
        job = self._conn._job(row[5:], now)
        if kind == "written" and status == "DONE":  # a fresh write's reply is lean
            return _with_result(job, value)
        return job

    async def commit(
        self,
        fence: Fence,
        result: str,
        *,
        finish_reason: str | None = None,
        facts: RunFacts | None = None,
    ) -> JobState:
        result = exact("commit", fence.key, "result", result, nul=False)
        return await self._finish("commit", fence, "DONE", result, diagnostic(finish_reason), facts)

    async def fail(
        self, fence: Fence, reason: str, *, kind: str | None = None, facts: RunFacts | None = None
    ) -> JobState:
        kind = kept_kind(kind, reason)
        return await self._finish(
            "fail", fence, "FAILED", clip(reason) or "", facts=facts, kind=kind
        )

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        key, stage = job_key(fence.key), diagnostic(stage)
        args = (key, fence.owner_id, fence.token, stage, clip(snapshot) or "")
        row = await self._conn._fetchone("report_stall", _STALL, args)
        return bool(row and row[0])

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        row = await self._conn._fetchone("cancel", _CANCEL, (job_key(key), clip(reason) or ""))
        return None if row is None else self._conn._job(row[1:], row[0])

    async def get(self, key: str) -> JobState | None:
        row = await self._conn._fetchone("get", _GET, (job_key(key),))
        return None if row is None else self._conn._job(row[1:], row[0])

    async def wait(self, key: str, timeout: float) -> None:
        """Return on the job's next event (commit, fail, release, cancel) or after
        ``timeout``: LISTEN/NOTIFY on the store's one listening connection, polling when
        that is unavailable."""
        await self._listener.wait(job_key(key), timeout)

    async def _version(self, key: str) -> Any:
        if key.startswith(WAKE):  # a limit's waiters (stores/postgres/slots.py)
            return await self.slots.seen(key[len(WAKE) :])
        return await self._conn._fetchone("wait", _VERSION, (key,))

    async def aclose(self) -> None:
        await self._listener.aclose()
        await self._conn.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r}, namespace={self.namespace!r})"


def _facts_args(facts: RunFacts | None) -> tuple[Any, ...]:
    """ail_finish's arguments for what ran (None: not known, the record keeps what it had)."""
    if facts is None:
        return (None,) * 8
    return (
        facts.provider or None,
        facts.model or None,
        facts.prompt_tokens,
        facts.completion_tokens,
        facts.reasoning_tokens,
        facts.first_token_s,
        facts.first_visible_s,
        facts.durations_json(),
    )


def _with_result(job: JobState, result: str) -> JobState:
    return replace(job, result=result)
