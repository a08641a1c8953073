"""The Redis store's job queue, workers and duration history.

The queue is a sorted set of "look again at" times, beside the lease index and one key per
worker; the history one hash per (pipeline, kind, stage) plus an index set. One script
each, one round trip, on the shared connection like the lease calls. The schedule is a hint
that workers correct, never the judge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import asdict
from typing import Any

import orjson
from redis.exceptions import ResponseError

from ai_lease.errors import CorruptRecord, CorruptSink, JobConflict, skip_corrupt
from ai_lease.job import JobState, Status, validate_key
from ai_lease.lease.admin import TERMINAL_STATUSES, Removal
from ai_lease.lease.histogram import checked_histogram
from ai_lease.lease.queue import QueueGauges, WorkerInfo, storable_worker
from ai_lease.lease.storable import exact
from ai_lease.stores.redis.calls import RedisCalls
from ai_lease.stores.redis.keys import decode, us
from ai_lease.stores.redis.queue_scripts import COUNTS

__all__ = ["RedisAdmin", "RedisQueue"]

PRUNE_BATCH = 100
"""Job hashes per PRUNE script (and per SCAN step) on a standalone server."""


class RedisQueue:
    """The :class:`~ai_lease.lease.queue.JobQueue` part of the Redis store, and its history."""

    def __init__(self, calls: RedisCalls) -> None:
        self._calls = calls

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        """Record the job and its queue entry in one script (standalone): a lost reply is
        :class:`~ai_lease.errors.OutcomeUnknown` (stored or not: check ``status``)."""
        spec = exact("submit", validate_key(key), "spec", spec)
        if self._calls._cluster:  # the queue is in another slot: its entry first, then the record
            await self._calls._cmd("submit", "ZADD", self._calls._queue, "LT", 0, key)
        reply = await self._calls._call("submit", key, "SUBMIT", [spec, fingerprint, key])
        if reply[0] == "conflict":
            raise JobConflict(key)
        job = decode(key, reply[2:], reply[1])
        if not job.status.terminal:
            self._calls._remember(key, spec)
        return job

    async def due(self, limit: int) -> list[str]:
        """Jobs whose lease lapsed first (recovery before fresh work; found through the lease
        index even without a queue entry; at most ``limit``), then the queue's due keys. The
        data-loss marker is checked in the same round trip."""
        keys = [self._calls._queue, self._calls._leases, *self._calls._marks]
        reply = await self._calls._eval("due", "DUE", keys, [limit, *self._calls._epoch_args()])
        self._calls._saw_epoch(reply[:2])
        lapsed = int(reply[2])
        found = [self._calls._key_of(name) for name in reply[3 : 3 + lapsed]] + reply[3 + lapsed :]
        return list(dict.fromkeys(found))[:limit]

    async def reschedule(self, key: str, at: float | None) -> None:
        args = [key, self._calls.keys(key)[0], "" if at is None else repr(float(at))]
        keys = [self._calls._queue, self._calls._leases, self._calls._recovery]
        await self._calls._eval("reschedule", "RESCHEDULE", keys, args)

    async def look(self, key: str, ttl: float) -> JobState | None:
        """A worker's look (:func:`~ai_lease.lease.queue.look_at`): the record, and its
        queue entry moved by :func:`~ai_lease.lease.queue.next_look`, in one script (on
        Cluster, where the queue is in another slot, its write follows as a second call)."""
        reply = await self._calls._call("look", key, "LOOK", [key, us(ttl)])
        at = reply[1]
        if self._calls._cluster and at != "-":
            await (self.reschedule(key, None) if at == "" else self.recover_at(key, float(at)))
        if len(reply) <= 2:
            return None
        job = decode(key, reply[2:], reply[0])
        if job.spec and not job.status.terminal:
            self._calls._remember(key, job.spec)
        return job

    async def recover_at(self, key: str, at: float) -> None:
        keys = [self._calls._queue, self._calls._recovery]
        await self._calls._eval("recover_at", "RECOVER_AT", keys, [key, repr(float(at))])

    async def due_recoveries(self, limit: int) -> list[str]:
        return list(
            await self._calls._eval(
                "due_recoveries", "DUE_RECOVERIES", [self._calls._recovery], [limit]
            )
        )

    def _worker_keys(self, worker_id: str) -> list[str]:
        index = f"{self._calls._ns}:workers"
        return [f"{{{index}}}:worker:{worker_id}", index]

    async def gauges(self) -> QueueGauges:
        """Queue entries due now and later, live and lapsed leases: one script of four
        ``ZCOUNT`` calls, one round trip. Redis keeps no count by status (counting means
        reading every job hash), so ``jobs`` is None; on Cluster the lease index is not
        kept, so neither are the lease counts."""
        keys = [self._calls._queue, self._calls._leases]
        due, later, live, lapsed = map(
            int, await self._calls._cmd("metrics", "EVAL", COUNTS, 2, *keys)
        )
        if self._calls._cluster:
            return QueueGauges(queue_due=due, queue_scheduled=later)
        return QueueGauges(None, due, later, live, lapsed)

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        info = storable_worker(info)
        blob = orjson.dumps({k: v for k, v in asdict(info).items() if k != "last_seen"})
        args = [info.worker_id, blob.decode(), round(ttl * 1000)]
        await self._calls._eval("worker_beat", "BEAT", self._worker_keys(info.worker_id), args)

    async def worker_gone(self, worker_id: str) -> None:
        keys = self._worker_keys(worker_id)
        await self._calls._eval("worker_gone", "WORKER_GONE", keys, [worker_id])

    async def list_workers(self, *, on_corrupt: CorruptSink | None = None) -> list[WorkerInfo]:
        prefix, index = self._worker_keys("")
        pairs = await self._calls._eval("list_workers", "LIST_WORKERS", [index], [prefix])
        out = []
        for worker_id, blob in zip(pairs[::2], pairs[1::2], strict=True):
            try:
                out.append(WorkerInfo.from_json(worker_id, blob))
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
        return out

    @staticmethod
    async def _listed(name: str, call: Awaitable[Any]) -> Any:
        """A read of a listing: a value that is not ours is a :class:`CorruptRecord`."""
        try:
            return await call
        except UnicodeDecodeError:
            raise CorruptRecord(name, "it holds bytes that are not UTF-8", kind="key") from None
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise CorruptRecord(name, "the key holds a value of another type", kind="key") from None

    # -- duration history: one hash per (pipeline, kind, stage), plus an index set -----------

    async def add_durations(self, counts: Mapping[tuple[str, str, str], Mapping[int, int]]) -> None:
        pipe = self._calls._client.pipeline(transaction=False)
        for series, buckets in counts.items():
            name = orjson.dumps(list(series)).decode()
            pipe.sadd(f"{self._calls._ns}:hists", name)
            for bucket, n in buckets.items():
                pipe.hincrby(f"{self._calls._ns}:hist:{name}", str(bucket), n)
        # One round trip; never resent (HINCRBY applied twice would count twice).
        if len(pipe):
            await self._calls._bounded("add_durations", "", pipe.execute, resend=False)

    async def load_durations(
        self, *, on_corrupt: CorruptSink | None = None
    ) -> dict[tuple[str, str, str], dict[int, int]]:
        index = f"{self._calls._ns}:hists"
        names = sorted(
            await self._listed(index, self._calls._cmd("load_durations", "SMEMBERS", index))
        )
        hists = [f"{self._calls._ns}:hist:{name}" for name in names]
        raws = await asyncio.gather(
            *(self._listed(h, self._calls._cmd("load_durations", "HGETALL", h)) for h in hists),
            return_exceptions=True,
        )
        out: dict[tuple[str, str, str], dict[int, int]] = {}
        for name, raw in zip(names, raws, strict=True):
            try:
                if isinstance(raw, BaseException):
                    raise raw
                pairs = (
                    raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=False)
                )
                try:
                    parts = orjson.loads(name)
                except orjson.JSONDecodeError:
                    parts = None
                series, counts = checked_histogram(name, parts, pairs)
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
                continue
            out[series] = counts
        return out


class RedisAdmin:
    """The :class:`~ai_lease.lease.admin.JobAdmin` part: retry, remove and prune."""

    def __init__(self, calls: RedisCalls) -> None:
        self._calls = calls

    # -- the jobs' lifecycle for people (JobAdmin): one script each --------------------------

    async def retry(self, key: str) -> JobState | None:
        reply = await self._calls._call("retry", key, "RETRY", [key])
        if len(reply) <= 1:
            return None
        job = decode(key, reply[1:], reply[0])
        if self._calls._cluster and job.status is Status.PENDING:  # the queue is in another slot
            await self._calls._cmd("retry", "ZADD", self._calls._queue, 0, key)
        return job

    async def remove(self, key: str, *, force: bool = False) -> Removal:
        reply = await self._calls._call("remove", key, "REMOVE", [key, "1" if force else ""])
        if len(reply) <= 1:
            return Removal(False, None)
        removed = reply[1] == "removed"
        if removed:
            self._calls._forget(key)
            if self._calls._cluster:  # the namespace's keys are in another slot
                await self._calls._unqueue(key)
        return Removal(removed, decode(key, reply[2:], reply[0]))

    async def prune(self, older_than: float, statuses: frozenset[str] = TERMINAL_STATUSES) -> int:
        """A SCAN of the namespace's job hashes, one PRUNE script per batch of
        :data:`PRUNE_BATCH` (one per job on Cluster): for people, not hot paths."""
        args = [us(older_than), ",".join(sorted(statuses & TERMINAL_STATUSES))]
        if not args[1]:
            return 0
        removed = 0
        async for names in self._calls._job_hashes(PRUNE_BATCH):
            if not self._calls._cluster:
                job_keys = [self._calls._key_of(name) for name in names]
                lines = [self._calls.keys(key)[2] for key in job_keys]  # their timelines
                keys = [
                    *names,
                    *lines,
                    self._calls._leases,
                    self._calls._queue,
                    self._calls._recovery,
                ]
                keys += [self._calls._created, self._calls._counts, self._calls._names]
                removed += await self._calls._eval(
                    "prune", "PRUNE", keys, [*args, len(names), *job_keys]
                )
                continue
            for name in names:
                key = self._calls._key_of(name)
                keys = [name, self._calls.keys(key)[2]]
                if await self._calls._eval("prune", "PRUNE", keys, [*args, 1, key]):
                    removed += 1
                    await self._calls._unqueue(key)
        return int(removed)
