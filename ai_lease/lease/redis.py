"""The scale-out store: Redis (standalone or Cluster), one Lua script per lease operation.

Every call goes through redis-py (hiredis parses), one code path for ``redis://``,
``rediss://``, ``unix://`` and Cluster. The client is built with redis-py's own retries
**off** (redis-py 8 retries by default: a black-holed PING took 8-9 s to fail here, and a
resent ``INCRBY`` was applied twice), and every operation is bounded by ``op_timeout``
without losing its connection (lease/redis_wire.py). Lost replies are handled a level up:
every script is safe to run twice. Followers wait on a pub/sub channel per job, falling back
to sleeping out the poll interval when pub/sub is unavailable.

>>> store = RedisStore.from_url("redis://127.0.0.1:6379/0")   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoScriptError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ai_lease.errors import (
    CorruptRecord,
    CorruptSink,
    FencingRejected,
    JobConflict,
    OutcomeUnknown,
    StoreDataLost,
    StoreUnavailable,
    skip_corrupt,
)
from ai_lease.job import JobState
from ai_lease.lease import redis_scripts as lua
from ai_lease.lease.base import (
    Acquired,
    AcquireOutcome,
    Fence,
    Finished,
    Following,
    Renewal,
    WorkerInfo,
)
from ai_lease.lease.redis_wire import WARM_CONNECTIONS, Tasks, WarmPool, within
from ai_lease.lease.rules import clip
from ai_lease.lease.urls import mask_url
from ai_lease.observe.history import checked_histogram
from ai_lease.resource import AsyncResource

__all__ = ["RedisStore", "hash_tag"]

log = logging.getLogger("ai_lease.store")

_SCRIPTS = (
    "ACQUIRE",
    "RENEW",
    "RELEASE",
    "FINISH",
    "REPORT_STALL",
    "CANCEL",
    "GET",
    "SUBMIT",
    "EPOCH",
    "DUE",
    "RESCHEDULE",
    "RECOVER_AT",
    "DUE_RECOVERIES",
    "BEAT",
    "WORKER_GONE",
    "LIST_WORKERS",
)
# Scripts that also keep the namespace's lease index (and, for SUBMIT, the queue).
_INDEXED = frozenset({"ACQUIRE", "RENEW", "RELEASE", "FINISH", "CANCEL"})
# Specs remembered to write back into a record re-created after a data loss.
_SPECS_KEPT, _SPEC_CHARS_KEPT = 64, 32 * 1024 * 1024


def hash_tag(key: str) -> str:
    """The Cluster hash tag of a job key: the key with ``%``, ``{`` and ``}`` escaped, so
    that no key (not even one starting with ``}``) gives an empty or a cut tag.

    >>> hash_tag("}abc{")
    '%7Dabc%7B'
    """
    return key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _untag(tag: str) -> str:
    return re.sub("%(25|7B|7D)", lambda m: chr(int(m[1], 16)), tag)


_TIME_FIELDS = frozenset(
    {
        "heartbeat_at",
        "last_progress_at",
        "lease_expires_at",
        "max_no_progress",
        "created_at",
        "updated_at",
        "started_at",
    }
)


# No CLIENT SETINFO on connect: two extra round trips per new connection, which a slow
# link pays inside the first operation's deadline.
try:
    from redis.driver_info import DriverInfo

    _NO_SETINFO: dict[str, Any] = {"driver_info": DriverInfo(name=None, lib_version=None)}
except ImportError:  # redis-py before 7.1
    _NO_SETINFO = {"lib_name": None, "lib_version": None}

# Maintenance notifications off: while on ("auto", redis-py 7+), the pool skips its check
# that an idle connection is still open, and after a server restart hands out dead ones.
try:
    from redis.maint_notifications import MaintNotificationsConfig

    _POOL_OPTIONS: dict[str, Any] = {
        "maint_notifications_config": MaintNotificationsConfig(enabled=False)
    }
except ImportError:  # redis-py before 7
    _POOL_OPTIONS = {}


def _never_sent(exc: BaseException) -> bool:
    """True when the error proves the command never reached the server."""
    text = str(exc)
    return (
        isinstance(exc, AuthenticationError)
        or "Connection refused" in text
        or "Error connecting" in text
        or "Timeout connecting" in text
    )


def _us(seconds: float) -> str:
    return str(round(seconds * 1_000_000))


class RedisStore(AsyncResource):
    """A :class:`~ai_lease.lease.base.LeaseStore` on Redis.

    Keys are ``<namespace>:{<job key>}:job`` (a hash) and ``<namespace>:{<job key>}:events``
    (a pub/sub channel); the ``{…}`` hash tag keeps one job's keys in one Cluster slot.
    """

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        where: str = "redis",
    ) -> None:
        self._client, self._ns, self._op_timeout, self.where = client, namespace, op_timeout, where
        self._prepared, self._prepare_lock = False, asyncio.Lock()
        self._cluster = hasattr(client, "get_nodes")
        self._scripts = {name: client.register_script(getattr(lua, name)) for name in _SCRIPTS}
        tag = f"{{{namespace}:queue}}"  # the slot of "<ns>:queue" itself
        self._queue, self._leases = f"{namespace}:queue", f"{tag}:leases"
        self._marks = [f"{tag}:epoch", f"{tag}:data_lost"]
        self._recovery = f"{tag}:recovery"  # the looks at RUNNING jobs, asked for first
        self._epoch: str | None = None  # the epoch this process saw first
        self.lost_data: StoreDataLost | None = None
        """Set once this process has seen the store lose its data (or a recent note of it)."""
        self._specs: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._spec_chars = 0
        # Commands still reading a late reply, and the pool's re-warming (lease/redis_wire.py).
        self._tasks, self._rewarming = Tasks(), False
        pool = getattr(client, "connection_pool", None)
        self._pool = pool if isinstance(pool, WarmPool) else None
        self._pubsub: Any = client
        if pool is not None and not self._cluster:
            # Pub/sub closes its connection after each wait: a pool of its own, so that it
            # never takes (and closes) one of the warm ones.
            kw = dict(pool.connection_kwargs)
            if self._pool is not None:
                plain = ConnectionPool(connection_class=pool.connection_class, **kw)
                self._pubsub = aioredis.Redis.from_pool(plain)
            # The data-loss marker is checked on every new connection, as it is set up.
            pool.connection_kwargs.setdefault("redis_connect_func", self._set_up)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
    ) -> RedisStore:
        """Connect to ``redis://``, ``rediss://``, ``unix://`` or, for Redis Cluster,
        ``redis+cluster://`` / ``rediss+cluster://`` — with redis-py's retries off."""
        options: dict[str, Any] = dict(
            decode_responses=True,
            # A reply later than op_timeout is still read (its caller has given up) for as
            # long again; one that never comes drops its connection then.
            socket_timeout=2 * op_timeout,
            socket_connect_timeout=op_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            **_NO_SETINFO,
        )
        if url.startswith(("redis+cluster://", "rediss+cluster://")):
            from redis.asyncio.cluster import RedisCluster

            plain = url.replace("+cluster://", "://", 1)
            client: Any = RedisCluster.from_url(plain, **options)
        else:
            pool = WarmPool.from_url(url, retry_on_timeout=False, **options, **_POOL_OPTIONS)
            client = aioredis.Redis.from_pool(pool)
        return cls(client, namespace=namespace, op_timeout=op_timeout, where=mask_url(url))

    def keys(self, key: str) -> list[str]:
        """The Redis keys of one job: its hash and its event channel (one hash tag)."""
        tag = hash_tag(key)
        return [f"{self._ns}:{{{tag}}}:job", f"{self._ns}:{{{tag}}}:events"]

    def _key_of(self, name: str) -> str:
        """The job key of a job hash's name (the inverse of ``keys(key)[0]``)."""
        return _untag(name[len(self._ns) + 2 : -len("}:job")])

    def _script_keys(self, key: str, script: str) -> list[str]:
        keys = self.keys(key)
        if self._cluster:  # the namespace's keys are in another slot
            return keys
        if script in _INDEXED:
            keys.append(self._leases)
        elif script == "SUBMIT":
            keys += [self._leases, self._queue]
        return keys

    # -- the data-loss marker ------------------------------------------------------------

    def _epoch_args(self) -> list[str]:
        return [self._epoch or "", secrets.token_hex(8)]

    async def _set_up(self, connection: Any) -> None:
        """A new connection's set-up (redis-py's, then the data-loss marker's check): the
        marker is checked at each connect, so a restart without data is noticed at once."""
        await connection.on_connect()
        sha, args = self._scripts["EPOCH"].sha, [*self._marks, *self._epoch_args()]
        try:
            try:
                await connection.send_command("EVALSHA", sha, 2, *args)
                reply = await connection.read_response()
            except NoScriptError:
                await connection.send_command("EVAL", lua.EPOCH, 2, *args)
                reply = await connection.read_response()
        except ResponseError:  # a read-only replica, an ACL: costs the check, not the link
            return
        self._saw_epoch(reply)

    def _saw_epoch(self, reply: Any) -> None:
        epoch, note = reply[0], reply[1]
        if self._epoch is None:
            self._epoch = epoch
        elif epoch != self._epoch:
            previous, self._epoch = self._epoch, epoch
            self._lost(StoreDataLost(self.where, previous=previous, current=epoch))
            return
        if note and self.lost_data is None:  # another process noticed: data_lost() says it
            at, previous, current = note.split(" ", 2)
            self.lost_data = StoreDataLost(self.where, previous, current, at=int(at) / 1_000_000)

    def _lost(self, loss: StoreDataLost) -> None:
        """This process saw the marker vanish: say so loudly, once per loss."""
        self.lost_data = loss
        log.error("%s", loss)

    async def data_lost(self) -> StoreDataLost | None:
        """Whether the store lost its data (a restart without persistence): this process saw
        its epoch marker vanish, or another process left a note of it (kept 7 days). One
        round trip.

        >>> if (loss := await store.data_lost()) is not None:   # doctest: +SKIP
        ...     print(loss)
        """
        self._saw_epoch(await self._eval("data_lost", "EPOCH", self._marks, self._epoch_args()))
        return self.lost_data

    async def _prepare(self) -> None:
        """Open the warm connections and load every script once per client (on Cluster: on
        every primary), so that many first operations at once neither connect inside their
        own deadlines nor all meet NOSCRIPT. Under a deadline of its own, before the
        operation's; if it fails, connections open on demand and NOSCRIPT falls back to EVAL."""
        async with self._prepare_lock:
            if self._prepared:
                return
            texts = [s.script for s in self._scripts.values()]
            try:
                async with asyncio.timeout(2 * self._op_timeout):  # once per client
                    if self._pool is not None:
                        await self._pool.warm(WARM_CONNECTIONS, 2 * self._op_timeout)
                    if self._cluster:  # every primary
                        await asyncio.gather(*(self._client.script_load(t) for t in texts))
                    else:  # one connection, one round trip
                        pipe = self._client.pipeline(transaction=False)
                        for text in texts:
                            pipe.script_load(text)
                        await pipe.execute()
            except (TimeoutError, RedisError, OSError):
                pass  # connections open on demand; EVAL stands in for a missing script
            self._prepared = True
        if self._epoch is None:  # the marker, checked at the first contact
            with contextlib.suppress(StoreUnavailable):
                await self.data_lost()

    async def _call(self, op: str, key: str, script: str, args: list[Any]) -> Any:
        return await self._eval(op, script, self._script_keys(key, script), args, key)

    async def _eval(
        self, op: str, script: str, keys: list[str], args: list[Any], key: str = ""
    ) -> Any:
        sha, count, execute = self._scripts[script].sha, len(keys), self._client.execute_command

        async def run() -> Any:
            try:
                return await execute("EVALSHA", sha, count, *keys, *args)
            except NoScriptError:  # the server lost its script cache: EVAL caches it again
                return await execute("EVAL", getattr(lua, script), count, *keys, *args)

        return await self._bounded(op, key, run)

    async def _cmd(self, op: str, *args: Any) -> Any:
        """One plain command, bounded like every script."""
        return await self._bounded(op, "", lambda: self._client.execute_command(*args))

    async def _bounded(
        self, op: str, key: str, run: Callable[[], Awaitable[Any]], *, resend: bool = True
    ) -> Any:
        if not self._prepared:
            await self._prepare()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout

        async def attempt() -> Any:
            try:
                return await run()
            except RedisConnectionError:
                if not resend or loop.time() >= deadline:
                    raise
                # The connection went stale (e.g. the server restarted). One resend on
                # another connection, inside the same deadline: every script is safe to run
                # twice, so a command that did land is not applied differently. The idle
                # connections went stale with it (most likely): closed, then re-opened in
                # the background.
                if self._pool is not None:
                    await self._pool.drop_idle()
                    self._rewarm()
                return await run()

        try:
            # The deadline ends the wait, not the command: it reads its late reply and
            # gives its connection back (lease/redis_wire.py).
            return await within(self._tasks.start(attempt(), self._failed), self._op_timeout)
        except UnicodeDecodeError:  # replies are decoded strictly
            raise CorruptRecord(key, "a field is not valid UTF-8") from None
        except ResponseError as exc:
            text = str(exc)
            if "AILEASE_CORRUPT" in text:
                detail = text.split("AILEASE_CORRUPT ", 1)[1].split(" script:", 1)[0]
                raise CorruptRecord(key, detail[:120]) from None
            if "WRONGTYPE" in text:
                raise CorruptRecord(key, "the key holds a non-hash value") from None
            raise StoreUnavailable(self.where, op, text[:200]) from exc
        except TimeoutError:  # its connection is still reading the reply: the spares serve
            raise self._unavailable(op, key, f"no answer within {self._op_timeout:g}s") from None
        except (RedisError, OSError) as exc:
            detail = type(exc).__name__ + ": " + str(exc)
            raise self._unavailable(op, key, detail, maybe_applied=not _never_sent(exc)) from exc

    def _failed(self, error: BaseException) -> None:
        """A command failed (its caller may have given up long ago): an error reply leaves
        its connection as it was; anything else may have closed it."""
        if not isinstance(error, ResponseError):
            self._rewarm()

    def _rewarm(self) -> None:
        """Open connections again in the background, up to the warm count."""
        if self._pool is None or self._rewarming:
            return
        self._rewarming = True
        pool, timeout = self._pool, 2 * self._op_timeout

        async def rewarm() -> None:
            try:
                await pool.warm(WARM_CONNECTIONS, timeout)
            finally:
                self._rewarming = False

        self._tasks.start(rewarm())

    def _unavailable(
        self, op: str, key: str, detail: str, *, maybe_applied: bool = True
    ) -> StoreUnavailable:
        if maybe_applied and op == "submit":  # the caller must be told it may be stored
            return OutcomeUnknown(self.where, op, detail, key=key)
        return StoreUnavailable(self.where, op, detail, maybe_applied=maybe_applied)

    def _decode(
        self,
        key: str,
        flat: list[Any],
        now_us: Any,
        extra: dict[str, Any] | None = None,
        names: tuple[str, ...] | None = None,
    ) -> JobState:
        """A record from a reply's field/value pairs, or from its values of ``names``."""
        if names is None:
            data: dict[str, Any] = dict(zip(flat[::2], flat[1::2], strict=True))
        else:
            data = dict(zip(names, flat, strict=True))
        if extra:  # values the reply left out (or empty) that the caller knows
            for name, value in extra.items():
                if not data.get(name):
                    data[name] = value
        try:
            for name in _TIME_FIELDS & data.keys():
                if data[name]:  # '' or None (nil): no time
                    data[name] = int(data[name]) / 1_000_000
            read_at = int(now_us) / 1_000_000
        except ValueError:
            raise CorruptRecord(key, f"a time field holds {data.get(name)!r:.40}") from None
        return JobState.from_fields(key, data, read_at)

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
        args = [
            owner_id,
            _us(ttl),
            _us(max_no_progress),
            stall_policy,
            fingerprint or "",
            "" if max_attempts is None else str(max_attempts),
            # After a data loss, a record this acquire re-creates gets its spec back.
            self._specs.get(key, "") if self.lost_data is not None else "",
        ]
        reply = await self._call("acquire", key, "ACQUIRE", args)
        kind = reply[0]
        if kind == "conflict":
            raise JobConflict(key)
        if kind == "acquired":
            job = self._decode(key, reply[3:], reply[1])
            return Acquired(Fence(key, owner_id, job.token), bool(reply[2]), job)
        job = self._decode(key, reply[2:], reply[1])
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
    ) -> Renewal:
        args = [
            fence.owner_id,
            fence.token,
            _us(ttl),
            stage or "",
            progress_version,
            _us(max_no_progress),
            _us(grace),
        ]
        reply = await self._call("renew", fence.key, "RENEW", args)
        if reply[0] == "ok":
            return Renewal(True, None, int(reply[1]) / 1_000_000, stalled=bool(reply[2]))
        current = (int(reply[2]), reply[3]) if reply[2] not in ("", None) else None
        return Renewal(False, reply[0], int(reply[1]) / 1_000_000, current=current)

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
        return bool(await self._call("release", fence.key, "RELEASE", args))

    async def _finish(
        self, op: str, fence: Fence, status: str, field: str, value: str, reason: str = ""
    ) -> JobState:
        args = [fence.owner_id, fence.token, status, field, value, reason]
        reply = await self._call(op, fence.key, "FINISH", args)
        if reply[0] == "rejected":
            current = (int(reply[2]), reply[3]) if reply[2] else None
            raise FencingRejected(fence.key, fence.pair, current, reply[1])
        # A fresh write's reply is lean (no result): the record holds the value just written.
        extra = {"result": value} if field == "result" else None
        self._forget(fence.key)
        names = lua.LEAN_FIELDS if reply[0] == "written" else None  # values only, in order
        return self._decode(fence.key, reply[2:], reply[1], extra, names)

    async def commit(
        self, fence: Fence, result: str, *, finish_reason: str | None = None
    ) -> JobState:
        return await self._finish("commit", fence, "DONE", "result", result, finish_reason or "")

    async def fail(self, fence: Fence, reason: str) -> JobState:
        return await self._finish("fail", fence, "FAILED", "last_error", clip(reason) or "")

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        args = [fence.owner_id, fence.token, stage or "", clip(snapshot) or ""]
        return bool(await self._call("report_stall", fence.key, "REPORT_STALL", args))

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        reply = await self._call("cancel", key, "CANCEL", [clip(reason) or ""])
        if len(reply) <= 1:
            return None
        self._forget(key)
        return self._decode(key, reply[1:], reply[0])

    async def get(self, key: str) -> JobState | None:
        reply = await self._call("get", key, "GET", [])
        if len(reply) <= 1:
            return None
        job = self._decode(key, reply[1:], reply[0])
        if job.spec and not job.status.terminal:
            self._remember(key, job.spec)
        return job

    def _remember(self, key: str, spec: str) -> None:
        """Keep the spec of a job this process may run: if the store loses its data, the
        record its owner re-creates gets the spec back (and a worker can run it again).
        The newest few, bounded in number and in size."""
        specs = self._specs
        self._spec_chars += len(spec) - len(specs.pop(key, ""))
        specs[key] = spec
        while len(specs) > _SPECS_KEPT or self._spec_chars > _SPEC_CHARS_KEPT:
            self._spec_chars -= len(specs.popitem(last=False)[1])

    def _forget(self, key: str) -> None:
        self._spec_chars -= len(self._specs.pop(key, ""))

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        """Scans the namespace (O(keys): for people, not for hot paths); unordered."""
        found, match = [], f"{self._ns}:{{*}}:job"
        if not self._cluster:  # bounded like every call
            cursor = "0"
            while True:
                cursor, names = await self._cmd(
                    "list_jobs", "SCAN", cursor, "MATCH", match, "COUNT", 500
                )
                found += [self._key_of(name) for name in names]
                if int(cursor) == 0:  # redis-py parses the cursor (an int)
                    break
        else:
            try:
                async for name in self._client.scan_iter(match=match, count=500):
                    found.append(self._key_of(name))
            except UnicodeDecodeError:
                raise CorruptRecord(match, "a key name is not valid UTF-8", kind="key") from None
            except (RedisError, OSError) as exc:
                raise StoreUnavailable(self.where, "list_jobs", str(exc)) from exc
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

    # -- the job queue: a sorted set of "look again at" times, a lease index, worker keys ------
    # One script each, one round trip, on the shared connection like the lease calls. The
    # schedule is a hint that workers correct, never the judge.

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        """Record the job and its queue entry in one script (standalone): a lost reply is
        :class:`~ai_lease.errors.OutcomeUnknown` (stored or not: check ``status``)."""
        if self._cluster:  # the queue is in another slot: its entry first, then the record
            await self._cmd("submit", "ZADD", self._queue, "LT", 0, key)
        reply = await self._call("submit", key, "SUBMIT", [spec, fingerprint, key])
        if reply[0] == "conflict":
            raise JobConflict(key)
        job = self._decode(key, reply[2:], reply[1])
        if not job.status.terminal:
            self._remember(key, spec)
        return job

    async def due(self, limit: int) -> list[str]:
        """Jobs whose lease lapsed first (recovery before fresh work; found through the lease
        index even without a queue entry; at most ``limit``), then the queue's due keys. The
        data-loss marker is checked in the same round trip."""
        keys = [self._queue, self._leases, *self._marks]
        reply = await self._eval("due", "DUE", keys, [limit, *self._epoch_args()])
        self._saw_epoch(reply[:2])
        lapsed = int(reply[2])
        found = [self._key_of(name) for name in reply[3 : 3 + lapsed]] + reply[3 + lapsed :]
        return list(dict.fromkeys(found))[:limit]

    async def reschedule(self, key: str, at: float | None) -> None:
        args = [key, self.keys(key)[0], "" if at is None else repr(float(at))]
        keys = [self._queue, self._leases, self._recovery]
        await self._eval("reschedule", "RESCHEDULE", keys, args)

    async def recover_at(self, key: str, at: float) -> None:
        keys = [self._queue, self._recovery]
        await self._eval("recover_at", "RECOVER_AT", keys, [key, repr(float(at))])

    async def due_recoveries(self, limit: int) -> list[str]:
        return list(await self._eval("due_recoveries", "DUE_RECOVERIES", [self._recovery], [limit]))

    def _worker_keys(self, worker_id: str) -> list[str]:
        index = f"{self._ns}:workers"
        return [f"{{{index}}}:worker:{worker_id}", index]

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        blob = orjson.dumps({k: v for k, v in asdict(info).items() if k != "last_seen"})
        args = [info.worker_id, blob.decode(), round(ttl * 1000)]
        await self._eval("worker_beat", "BEAT", self._worker_keys(info.worker_id), args)

    async def worker_gone(self, worker_id: str) -> None:
        keys = self._worker_keys(worker_id)
        await self._eval("worker_gone", "WORKER_GONE", keys, [worker_id])

    async def list_workers(self, *, on_corrupt: CorruptSink | None = None) -> list[WorkerInfo]:
        prefix, index = self._worker_keys("")
        pairs = await self._eval("list_workers", "LIST_WORKERS", [index], [prefix])
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
        pipe = self._client.pipeline(transaction=False)
        for series, buckets in counts.items():
            name = orjson.dumps(list(series)).decode()
            pipe.sadd(f"{self._ns}:hists", name)
            for bucket, n in buckets.items():
                pipe.hincrby(f"{self._ns}:hist:{name}", str(bucket), n)
        # One round trip; never resent (HINCRBY applied twice would count twice).
        if len(pipe):
            await self._bounded("add_durations", "", pipe.execute, resend=False)

    async def load_durations(
        self, *, on_corrupt: CorruptSink | None = None
    ) -> dict[tuple[str, str, str], dict[int, int]]:
        index = f"{self._ns}:hists"
        names = sorted(await self._listed(index, self._cmd("load_durations", "SMEMBERS", index)))
        hists = [f"{self._ns}:hist:{name}" for name in names]
        raws = await asyncio.gather(
            *(self._listed(h, self._cmd("load_durations", "HGETALL", h)) for h in hists),
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

    async def wait(self, key: str, timeout: float) -> None:
        """Return on the job's next event (commit, fail, release) or after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not hasattr(self._pubsub, "pubsub"):  # redis-py's asyncio Cluster client: poll
            await asyncio.sleep(timeout)
            return
        pubsub = self._pubsub.pubsub()
        try:
            async with asyncio.timeout(timeout):
                await pubsub.subscribe(self.keys(key)[1])
                # Every read has a bound of its own too: redis-py (8.1) can lose the timeout's
                # cancellation inside subscribe's connect under load, and a read without a
                # bound then blocks until the job's next event, which may never come.
                while (left := deadline - loop.time()) > 0:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
                    if message is not None:
                        return
        except TimeoutError:
            return
        except (RedisError, OSError):  # pub/sub unavailable: poll instead
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    async def aclose(self) -> None:
        await self._tasks.aclose()
        if self._pubsub is not self._client:
            await self._pubsub.aclose()
        await self._client.aclose()

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r}, namespace={self._ns!r})"
