"""The workers' side of a store: the :class:`JobQueue` protocol (when to look at a job
again, who is working) and a worker's heartbeat entry, :class:`WorkerInfo`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, runtime_checkable

import orjson

from ai_lease.errors import CorruptRecord, CorruptSink, InputError
from ai_lease.job import JobState, Status
from ai_lease.lease.storable import diagnostic, storable

__all__ = [
    "MAX_REPORTED_JOBS",
    "GaugedStore",
    "JobQueue",
    "QueueGauges",
    "WorkerInfo",
    "due_now",
    "look_at",
    "next_look",
    "runnable",
    "storable_worker",
    "unschedules_ended",
]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A live worker as it last reported itself."""

    worker_id: str
    host: str
    pid: int
    running: int
    concurrency: int
    last_seen: float  # store clock
    started_at: float
    jobs: tuple[str, ...] = ()  # the keys it runs (at most MAX_REPORTED_JOBS of them)

    @classmethod
    def from_json(cls, worker_id: str, blob: str | bytes) -> WorkerInfo:
        """A stored worker entry, checked field by field (:class:`CorruptRecord` if not ours)."""
        try:
            data: Any = orjson.loads(blob)
        except orjson.JSONDecodeError:
            raise CorruptRecord(worker_id, "the entry is not JSON", kind="worker") from None
        if not isinstance(data, dict):
            raise CorruptRecord(worker_id, "the entry is not a JSON object", kind="worker")
        values: dict[str, Any] = {"jobs": _reported_jobs(worker_id, data.get("jobs", []))}
        for spec in fields(cls):
            if spec.name == "jobs":
                continue
            value, kind = data.get(spec.name), _WORKER_TYPES[spec.type]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise CorruptRecord(
                    worker_id, f"field {spec.name!r} holds {str(value)[:40]!r}", kind="worker"
                )
            values[spec.name] = value
        return cls(**values)


def storable_worker(info: WorkerInfo) -> WorkerInfo:
    """``info`` as every store can keep it: its host name made storable (a diagnostic); a
    worker id that is not (a NUL, or a lone surrogate from an argv byte that is not UTF-8)
    is its identity, so an :class:`~ai_lease.errors.InputError`, never altered."""
    if not info.worker_id or not storable(info.worker_id):
        raise InputError(
            f"worker id {info.worker_id!r:.80} is not storable (empty, or holding a NUL or a "
            "lone surrogate): name the worker with printable characters (--worker-id)"
        )
    if storable(info.host):
        return info
    return replace(info, host=diagnostic(info.host) or "")


MAX_REPORTED_JOBS = 64
"""How many of its job keys a worker reports in its heartbeat (a count is always exact)."""


def _reported_jobs(worker_id: str, value: Any) -> tuple[str, ...]:
    """A worker entry's job keys (an entry written before workers reported them has none)."""
    if not isinstance(value, list) or not all(isinstance(key, str) for key in value):
        raise CorruptRecord(worker_id, f"field 'jobs' holds {str(value)[:40]!r}", kind="worker")
    return tuple(value[:MAX_REPORTED_JOBS])


_WORKER_TYPES: dict[Any, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
}


@runtime_checkable
class JobQueue(Protocol):
    """Jobs recorded for workers, and who is working. Both built-in stores implement it.

    The queue is a schedule of *when to look at a job again*, not a list of claims:
    ``due()`` hands out keys whose time has come, any number of workers may look at the
    same key, and ``acquire`` decides who runs it. A worker that finds a live lease moves
    the key to that lease's expiry; a finished job leaves the schedule.

    Two optional members save a worker round trips (every built-in store has them):
    ``async look(key, ttl)``, the record read and its entry moved by :func:`next_look` in
    one call (else :func:`look_at` reads, then reschedules), and ``unschedules_ended``, true
    when a commit or fail takes the job off the schedule itself (else the worker
    reschedules it off).
    """

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState: ...

    async def due(self, limit: int) -> list[str]: ...

    async def reschedule(self, key: str, at: float | None) -> None:
        """Look at ``key`` again at ``at`` (store clock) as plain work, dropping any recovery
        look set by :meth:`recover_at`; ``None`` takes the key off the schedule altogether."""
        ...

    async def recover_at(self, key: str, at: float) -> None:
        """Look at ``key`` again at ``at`` (store clock) as a **recovery**: its owner holds a
        lease that may lapse then (a worker sets this for every job it sees or starts
        RUNNING). Once due, the key is handed out by :meth:`due_recoveries`, which workers
        ask before :meth:`due`, so an abandoned job never waits behind fresh work; ``due()``
        still includes it. A later :meth:`reschedule` replaces it."""
        ...

    async def due_recoveries(self, limit: int) -> list[str]:
        """Up to ``limit`` keys whose recovery look (:meth:`recover_at`) is due, the
        longest-due first."""
        ...

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None: ...

    async def worker_gone(self, worker_id: str) -> None: ...

    async def list_workers(self, *, on_corrupt: CorruptSink | None = None) -> list[WorkerInfo]:
        """Live workers; a corrupt entry raises, or with ``on_corrupt`` is skipped."""
        ...


def runnable(record: JobState | None) -> bool:
    """Whether a worker that read ``record`` should try to run its job: it has a spec, has
    not ended, and no live lease holds it."""
    if record is None or record.status.terminal or record.spec is None:
        return False
    return not (record.status is Status.RUNNING and record.lease_live)


def next_look(record: JobState | None, ttl: float) -> float | None:
    """When (store clock) a worker that read ``record`` looks at its job again: never (None:
    nothing to run, the job leaves the schedule), when the live owner's lease may lapse, or,
    for a job the reader is about to run, ``ttl`` on, when its own lease could lapse should
    it die. Every store's ``look`` moves the queue entry by this rule."""
    if record is None or record.status.terminal or record.spec is None:
        return None
    if record.status is Status.RUNNING and record.lease_live:
        return record.lease_expires_at or record.read_at
    return record.read_at + ttl


async def look_at(store: Any, key: str, ttl: float) -> JobState | None:
    """A worker's look at ``key``: its record, its queue entry moved by :func:`next_look`
    (off the schedule, a recovery look at a live owner's expiry, or at ``ttl`` on). One call
    on a store with a ``look`` method (every built-in store: one round trip on a standalone
    Redis, one statement on PostgreSQL, one transaction on SQLite), else a read and a write
    of the queue."""
    own = getattr(store, "look", None)
    if own is not None:
        job: JobState | None = await own(key, ttl)
        return job
    record: JobState | None = await store.get(key)
    at = next_look(record, ttl)
    if at is None:
        await store.reschedule(key, None)
    else:
        await store.recover_at(key, at)
    return record


def unschedules_ended(store: object) -> bool:
    """Whether ``store``'s commit and fail take the job off the workers' schedule in the
    same write (then a worker need not :meth:`~JobQueue.reschedule` it after its own
    finish). Built-in stores do, but for a Redis Cluster (the queue is in another slot)."""
    return bool(getattr(store, "unschedules_ended", False))


async def due_now(store: object, key: str) -> None:
    """Tell the workers' queue (if the store keeps one) that ``key`` is free at once: a
    released job is then taken after one sweep, not when it was next due."""
    if isinstance(store, JobQueue):
        await store.reschedule(key, 0.0)


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """What a store tells of itself from its own indexes, for the store-wide gauges (never a
    scan of the job records): ``jobs`` per status, queue entries due now and later, live
    and lapsed leases. None: this store does not keep that count."""

    jobs: Mapping[str, int] | None = None
    queue_due: int | None = None
    queue_scheduled: int | None = None
    leases_live: int | None = None
    leases_lapsed: int | None = None


@runtime_checkable
class GaugedStore(Protocol):
    """A store that reads its gauges in one bounded call (every built-in store does)."""

    async def gauges(self) -> QueueGauges: ...
