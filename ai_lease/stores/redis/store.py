"""The scale-out store: Redis (standalone or Cluster), one Lua script per lease operation.

Every call goes through redis-py (hiredis parses), one code path for ``redis://``,
``rediss://``, ``unix://`` and Cluster, bounded by ``op_timeout`` with redis-py's retries off
(stores/redis/calls.py). Followers wait on a pub/sub channel per job, falling back to sleeping
out the poll interval when pub/sub is unavailable. The store is composed of parts sharing its
calls: the job queue, workers, history and admin (stores/redis/queue.py), the listing
(stores/redis/listing.py), the timeline (stores/redis/notes.py) and provider slots
(stores/redis/slots.py); keys and decoding are in stores/redis/keys.py.

>>> store = RedisStore.from_url("redis://127.0.0.1:6379/0")   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from ai_lease.errors import (
    CorruptRecord,
    CorruptSink,
    FencingRejected,
    JobConflict,
    StoreDataLost,
    StoreUnavailable,
    skip_corrupt,
)
from ai_lease.failure import kept_kind
from ai_lease.job import JobState, RunFacts, validate_key
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
from ai_lease.redaction import mask_url
from ai_lease.refusal import Refusal
from ai_lease.resource import AsyncResource
from ai_lease.stores.redis.calls import RedisCalls, connect
from ai_lease.stores.redis.keys import decode, decode_read, hash_tag, us
from ai_lease.stores.redis.listing import RedisListing
from ai_lease.stores.redis.notes import RedisTimeline
from ai_lease.stores.redis.prelude import LEAN_FIELDS
from ai_lease.stores.redis.queue import RedisAdmin, RedisQueue
from ai_lease.stores.redis.slots import RedisSlots
from ai_lease.stores.redis.wire import wait_message

__all__ = ["RedisStore", "hash_tag"]

_ACQUIRE_READ = (*LEAN_FIELDS, "checkpoint")  # what ACQUIRE reads, in order


class RedisStore(AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on Redis.

    Keys are ``<namespace>:{<job key>}:job`` (a hash) and ``<namespace>:{<job key>}:events``
    (a pub/sub channel); the ``{…}`` hash tag keeps one job's keys in one Cluster slot.

    The store owns one :class:`RedisCalls` (the client, its scripts, every call bounded) and
    is composed of parts that share it: ``queue`` (queue, workers, gauges, duration history),
    ``admin`` (retry / remove / prune), ``listing`` (pages and counts), ``notes`` (the
    job's timeline and its notes) and ``slots`` (provider slots). The lease operations are
    its own methods; the parts' methods are bound onto the store, so callers see one object.
    """

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        where: str = "redis",
        create: bool = True,
    ) -> None:
        self._calls = calls = RedisCalls(
            client, namespace=namespace, op_timeout=op_timeout, where=where, create=create
        )
        self.where, self._ns = calls.where, calls._ns
        # the client, its scripts and keys, for benchmarks and tests that reach past the store
        self._client, self._pool, self._scripts = calls._client, calls._pool, calls._scripts
        self.keys, self._key_of, self._script_keys = calls.keys, calls._key_of, calls._script_keys
        self.data_lost = calls.data_lost
        self.queue, self.admin = RedisQueue(calls), RedisAdmin(calls)
        self.listing, self.notes = RedisListing(calls), RedisTimeline(calls)
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
        self.slots = slots = RedisSlots(calls)
        self.acquire_slot, self.renew_slot = slots.acquire_slot, slots.renew_slot
        self.release_slot, self.leave_slot = slots.release_slot, slots.leave_slot
        self.slot_state, self.wait_slot = slots.slot_state, slots.wait_slot
        self.pause_slot, self.reweigh_slot = slots.pause_slot, slots.reweigh_slot

    @property
    def unschedules_ended(self) -> bool:
        """Whether a commit or fail takes the job off the workers' schedule in its own
        script: on a standalone server (on Cluster the queue is in another slot)."""
        return not self._calls._cluster

    @property
    def lost_data(self) -> StoreDataLost | None:
        """Set once this process has seen the store lose its data (or a recent note of it)."""
        return self._calls.lost_data

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        create: bool = True,
    ) -> RedisStore:
        """Connect to ``redis://``, ``rediss://``, ``unix://`` or, for Redis Cluster,
        ``redis+cluster://`` / ``rediss+cluster://`` — with redis-py's retries off.
        ``create=False`` (a look) writes none of the namespace's marker keys."""
        client = connect(url, op_timeout)
        where = mask_url(url)
        return cls(client, namespace=namespace, op_timeout=op_timeout, where=where, create=create)

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
        args = [
            owner_id,
            us(ttl),
            us(max_no_progress),
            stall_policy,
            fingerprint or "",
            "" if max_attempts is None else str(max_attempts),
            # After a data loss, a record this acquire re-creates gets its spec back.
            self._calls._specs.get(key, "") if self._calls.lost_data is not None else "",
            "" if renew_interval is None else us(renew_interval),
        ]
        reply = await self._calls._call("acquire", key, "ACQUIRE", args)
        kind = reply[0]
        if kind == "conflict":
            raise JobConflict(key)
        if kind == "acquired":
            job = decode_read(key, _ACQUIRE_READ, reply[3], reply[4], reply[1])
            taken = bool(reply[2])
            cause = job.takeover_cause if taken else None
            return Acquired(Fence(key, owner_id, job.token), taken, job, cause)
        if kind == "following":  # the checkpoint is the owner's alone
            return Following(decode(key, reply[2][:-1], reply[1], names=LEAN_FIELDS))
        return Finished(decode(key, reply[2:], reply[1]))

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
        args = [
            fence.owner_id,
            fence.token,
            us(ttl),
            diagnostic(stage) or "",
            progress_version,
            us(max_no_progress),
            us(grace),
            checkpoint or "",
        ]
        reply = await self._calls._call("renew", fence.key, "RENEW", args)
        if reply[0] == "ok":
            return Renewal(True, None, int(reply[1]) / 1_000_000, stalled=bool(reply[2]))
        current = _current(fence, reply[2], reply[3]) if reply[2] not in ("", None) else None
        return Renewal(False, Refusal(reply[0]), int(reply[1]) / 1_000_000, current=current)

    async def release(
        self,
        fence: Fence,
        *,
        error: str | None = None,
        snapshot: str | None = None,
        interrupted: bool = False,
    ) -> bool:
        args = [fence.owner_id, fence.token, clip(error) or "", clip(snapshot) or ""]
        args.append("1" if interrupted else "")
        return bool(await self._calls._call("release", fence.key, "RELEASE", args))

    async def _finish(
        self,
        op: str,
        fence: Fence,
        status: str,
        field: str,
        value: str,
        reason: str = "",
        facts: RunFacts | None = None,
        kind: str = "",
    ) -> JobState:
        args = [fence.owner_id, fence.token, status, field, value, reason, *_facts_args(facts)]
        args += [kind, fence.key]
        reply = await self._calls._call(op, fence.key, "FINISH", args)
        if reply[0] == "rejected":
            current = _current(fence, reply[2], reply[3]) if reply[2] else None
            raise FencingRejected(fence.key, fence, current, Refusal(reply[1]))
        # A fresh write's reply is lean (no result): the record holds the value just written.
        extra = {"result": value} if field == "result" else None
        self._calls._forget(fence.key)
        names = LEAN_FIELDS if reply[0] == "written" else None  # values only, in order
        return decode(fence.key, reply[2:], reply[1], extra, names)

    async def commit(
        self,
        fence: Fence,
        result: str,
        *,
        finish_reason: str | None = None,
        facts: RunFacts | None = None,
    ) -> JobState:
        result = exact("commit", fence.key, "result", result)
        reason, facts = diagnostic(finish_reason) or "", ran(facts)
        return await self._finish("commit", fence, "DONE", "result", result, reason, facts)

    async def fail(
        self, fence: Fence, reason: str, *, kind: str | None = None, facts: RunFacts | None = None
    ) -> JobState:
        text = clip(reason) or ""
        kind = kept_kind(kind, text)
        return await self._finish(
            "fail", fence, "FAILED", "last_error", text, facts=ran(facts), kind=kind
        )

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        args = [fence.owner_id, fence.token, diagnostic(stage) or "", clip(snapshot) or ""]
        return bool(await self._calls._call("report_stall", fence.key, "REPORT_STALL", args))

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        reply = await self._calls._call("cancel", key, "CANCEL", [clip(reason) or ""])
        if len(reply) <= 1:
            return None
        self._calls._forget(key)
        return decode(key, reply[1:], reply[0])

    async def get(self, key: str) -> JobState | None:
        reply = await self._calls._call("get", key, "GET", [])
        if len(reply) <= 1:
            return None
        job = decode(key, reply[1:], reply[0])
        if job.spec and not job.status.terminal:
            self._calls._remember(key, job.spec)
        return job

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        """Scans the namespace (O(keys): for people, not for hot paths); unordered."""
        found, match = [], f"{self._calls._ns}:{{*}}:job"
        if not self._calls._cluster:  # bounded like every call
            cursor = "0"
            while True:
                cursor, names = await self._calls._cmd(
                    "list_jobs", "SCAN", cursor, "MATCH", match, "COUNT", 500
                )
                found += [self._calls._key_of(name) for name in names]
                if int(cursor) == 0:  # redis-py parses the cursor (an int)
                    break
        else:
            try:
                async for name in self._calls._client.scan_iter(match=match, count=500):
                    found.append(self._calls._key_of(name))
            except UnicodeDecodeError:
                raise CorruptRecord(match, "a key name is not valid UTF-8", kind="key") from None
            except (RedisError, OSError) as exc:
                raise StoreUnavailable(self._calls.where, "list_jobs", str(exc)) from exc
        jobs = []
        for key in found:
            try:
                job = await self.get(key)
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
                continue
            if job is not None and (status is None or job.status.value == status):
                jobs.append(job)
                if len(jobs) >= limit:
                    break
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    async def wait(self, key: str, timeout: float) -> None:
        """Return on the job's next event (commit, fail, release) or after ``timeout``."""
        await wait_message(self._calls._pubsub, self._calls.keys(key)[1], timeout)

    async def aclose(self) -> None:
        await self._calls.aclose()

    def __repr__(self) -> str:
        return f"RedisStore({self._calls.where!r}, namespace={self._calls._ns!r})"


def _facts_args(facts: RunFacts | None) -> list[str]:
    """FINISH's ARGV for what ran ('' = not known: the record keeps what it had)."""
    if facts is None:
        return [""] * 8
    first = "" if facts.first_token_s is None else us(facts.first_token_s)
    counts = (facts.prompt_tokens, facts.completion_tokens)
    return [
        facts.provider or "",
        facts.model or "",
        *("" if n is None else str(n) for n in counts),
        first,
        facts.durations_json() or "",
        "" if facts.reasoning_tokens is None else str(facts.reasoning_tokens),
        "" if facts.first_visible_s is None else us(facts.first_visible_s),
    ]


def _current(fence: Fence, token: Any, owner: Any) -> Fence:
    """The fence a refusal reports the store holding (for ``fence``'s job)."""
    return Fence(fence.key, owner or "", int(token))
