"""The scale-out store: Redis (standalone or Cluster), one Lua script per lease operation.

The client is built with redis-py's own retries **off** (redis-py 8 retries by default: a
black-holed PING took 8-9 s to fail here, and a resent ``INCRBY`` was applied twice), and
every operation is bounded by ``op_timeout``. Lost replies are handled a level up: every
script is safe to run twice. Followers wait on a pub/sub channel per job, falling back to
sleeping out the poll interval when pub/sub is unavailable.

>>> store = RedisStore.from_url("redis://127.0.0.1:6379/0")   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import asdict
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ..errors import CorruptRecord, FencingRejected, JobConflict, StoreUnavailable
from ..job import JobState
from . import redis_scripts as lua
from .base import Acquired, AcquireOutcome, Fence, Finished, Following, Renewal, WorkerInfo
from .resp import Multiplexed
from .rules import clip
from .urls import mask_url

__all__ = ["RedisStore"]

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


def _never_sent(exc: BaseException) -> bool:
    """True when the error proves the command never reached the server."""
    text = str(exc)
    return (
        isinstance(exc, AuthenticationError)
        or "Connection refused" in text
        or ("Error connecting" in text)
    )


def _us(seconds: float) -> str:
    return str(round(seconds * 1_000_000))


class RedisStore:
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
        multiplex: bool = True,
    ) -> None:
        self._client, self._ns, self._op_timeout, self.where = client, namespace, op_timeout, where
        self._prepared, self._prepare_lock = False, asyncio.Lock()
        self._scripts = {
            name: client.register_script(getattr(lua, name))
            for name in ("ACQUIRE", "RENEW", "RELEASE", "FINISH", "REPORT_STALL", "GET", "SUBMIT")
        }
        # The lease scripts' fast path: one shared connection, replies matched in order
        # (lease/resp.py); TLS and Cluster keep redis-py for them too.
        self._fast = (
            Multiplexed.for_client(
                client, {s.sha: s.script for s in self._scripts.values()}, op_timeout
            )
            if multiplex
            else None
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        multiplex: bool = True,
    ) -> RedisStore:
        """Connect to ``redis://``, ``rediss://``, ``unix://`` or, for Redis Cluster,
        ``redis+cluster://`` / ``rediss+cluster://`` — with redis-py's retries off."""
        options: dict[str, Any] = dict(
            decode_responses=True,
            socket_timeout=op_timeout,
            socket_connect_timeout=op_timeout,
            retry=Retry(NoBackoff(), 0),
            **_NO_SETINFO,
        )
        if url.startswith(("redis+cluster://", "rediss+cluster://")):
            from redis.asyncio.cluster import RedisCluster

            plain = url.replace("+cluster://", "://", 1)
            client: Any = RedisCluster.from_url(plain, **options)
        else:
            client = aioredis.from_url(url, retry_on_timeout=False, **options)
        return cls(
            client,
            namespace=namespace,
            op_timeout=op_timeout,
            where=mask_url(url),
            multiplex=multiplex,
        )

    def keys(self, key: str) -> list[str]:
        """The Redis keys of one job: its hash and its event channel."""
        return [f"{self._ns}:{{{key}}}:job", f"{self._ns}:{{{key}}}:events"]

    async def _prepare(self) -> None:
        """Load every script once per client (on Cluster: on every primary), so that many
        first operations at once do not all meet NOSCRIPT and reload concurrently. The loads
        go out together (one round trip), under a deadline of their own before the
        operation's; if they fail, EVALSHA's own NOSCRIPT fallback still works."""
        async with self._prepare_lock:
            if self._prepared:
                return
            texts = [s.script for s in self._scripts.values()]
            try:
                async with asyncio.timeout(2 * self._op_timeout):  # once per client
                    if hasattr(self._client, "get_nodes"):  # Cluster: every primary
                        await asyncio.gather(*(self._client.script_load(t) for t in texts))
                    else:  # one connection, one round trip
                        pipe = self._client.pipeline(transaction=False)
                        for text in texts:
                            pipe.script_load(text)
                        await pipe.execute()
            except (TimeoutError, RedisError, OSError):
                pass  # EVALSHA reloads a missing script itself; do not try again per op
            self._prepared = True

    async def _call(self, op: str, key: str, script: str, args: list[Any]) -> Any:
        fast, keys = self._fast, self.keys(key)
        if fast is None and not self._prepared:
            await self._prepare()
        elif fast is not None and not fast.connected:
            # Connecting has a deadline of its own (op_timeout): an operation that must first
            # connect may take up to twice op_timeout, never more.
            try:
                await fast.connect()
            except (RedisError, OSError) as exc:
                detail = type(exc).__name__ + ": " + str(exc)
                raise StoreUnavailable(self.where, op, detail, maybe_applied=False) from exc

        if fast is not None:  # the op's deadline is a timer on its reply (lease/resp.py)
            deadline = asyncio.get_running_loop().time() + self._op_timeout
            sha = self._scripts[script].sha

            def attempt() -> Awaitable[Any]:
                return fast.evalsha(sha, keys, args, deadline)

            bounded: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()
        else:

            def attempt() -> Awaitable[Any]:
                return self._scripts[script](keys=keys, args=args)  # type: ignore[no-any-return]

            bounded = asyncio.timeout(self._op_timeout)
        try:
            async with bounded:
                try:
                    return await attempt()
                except RedisConnectionError:
                    # The connection went stale (e.g. the server restarted). One resend on
                    # a fresh connection, inside the same deadline: every script is safe to
                    # run twice, so a command that did land is not applied differently.
                    return await attempt()
        except UnicodeDecodeError:  # both paths decode strictly, one reply at a time
            raise CorruptRecord(key, "a field is not valid UTF-8") from None
        except ResponseError as exc:
            text = str(exc)
            if "AILEASE_CORRUPT" in text:
                detail = text.split("AILEASE_CORRUPT ", 1)[1].split(" script:", 1)[0]
                raise CorruptRecord(key, detail[:120]) from None
            if "WRONGTYPE" in text:
                raise CorruptRecord(key, "the key holds a non-hash value") from None
            raise StoreUnavailable(self.where, op, text[:200]) from exc
        except TimeoutError:
            if fast is not None:  # a black hole or a paused server: start afresh next time
                fast.reset()
            raise StoreUnavailable(
                self.where, op, f"no answer within {self._op_timeout:g}s"
            ) from None
        except (RedisError, OSError) as exc:
            detail = type(exc).__name__ + ": " + str(exc)
            raise StoreUnavailable(
                self.where, op, detail, maybe_applied=not _never_sent(exc)
            ) from exc

    def _decode(
        self, key: str, flat: list[Any], now_us: Any, extra: dict[str, Any] | None = None
    ) -> JobState:
        data: dict[str, Any] = dict(zip(flat[::2], flat[1::2], strict=True))
        if extra:  # values the reply left out (or empty) that the caller knows
            for name, value in extra.items():
                if not data.get(name):
                    data[name] = value
        try:
            for name in _TIME_FIELDS & data.keys():
                if data[name] != "":
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

    async def _finish(self, op: str, fence: Fence, status: str, field: str, value: str) -> JobState:
        args = [fence.owner_id, fence.token, status, field, value]
        reply = await self._call(op, fence.key, "FINISH", args)
        if reply[0] == "rejected":
            current = (int(reply[2]), reply[3]) if reply[2] else None
            raise FencingRejected(fence.key, fence.pair, current, reply[1])
        # A fresh write's reply is lean (no result): the record holds the value just written.
        extra = {"result": value} if field == "result" else None
        return self._decode(fence.key, reply[2:], reply[1], extra)

    async def commit(self, fence: Fence, result: str) -> JobState:
        return await self._finish("commit", fence, "DONE", "result", result)

    async def fail(self, fence: Fence, reason: str) -> JobState:
        return await self._finish("fail", fence, "FAILED", "last_error", clip(reason) or "")

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        args = [fence.owner_id, fence.token, stage or "", clip(snapshot) or ""]
        return bool(await self._call("report_stall", fence.key, "REPORT_STALL", args))

    async def get(self, key: str) -> JobState | None:
        reply = await self._call("get", key, "GET", [])
        return self._decode(key, reply[1:], reply[0]) if len(reply) > 1 else None

    async def list_jobs(self, *, status: str | None = None, limit: int = 100) -> list[JobState]:
        """Scans the namespace (O(keys): for people, not for hot paths); unordered."""
        prefix, found = f"{self._ns}:{{", []
        try:
            async for name in self._client.scan_iter(match=f"{prefix}*}}:job", count=500):
                found.append(name[len(prefix) : -len("}:job")])
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(self.where, "list_jobs", str(exc)) from exc
        jobs = []
        for key in found:
            job = await self.get(key)
            if job is not None and (status is None or job.status.value == status):
                jobs.append(job)
                if len(jobs) >= limit:
                    break
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)

    # -- the job queue: a sorted set of "look again at" times, worker hashes -------------------
    # These keys are per namespace, not per job, so they are written next to (not inside)
    # the job scripts; the schedule is a hint that workers correct, never the judge.

    @property
    def _queue(self) -> str:
        return f"{self._ns}:queue"

    async def _plain(self, op: str, call: Any) -> Any:
        try:
            async with asyncio.timeout(self._op_timeout):
                return await call
        except TimeoutError:
            raise StoreUnavailable(
                self.where, op, f"no answer within {self._op_timeout:g}s"
            ) from None
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(self.where, op, f"{type(exc).__name__}: {exc}") from exc

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        reply = await self._call("submit", key, "SUBMIT", [spec, fingerprint])
        if reply[0] == "conflict":
            raise JobConflict(key)
        job = self._decode(key, reply[2:], reply[1])
        if not job.status.terminal:  # LT: add it, or bring its time forward, never back
            zadd = self._client.zadd(self._queue, {key: job.read_at}, lt=True)
            await self._plain("submit", zadd)
        return job

    async def due(self, limit: int) -> list[str]:
        now = await self._plain("due", self._client.time())
        at = now[0] + now[1] / 1_000_000
        keys = await self._plain(
            "due", self._client.zrangebyscore(self._queue, "-inf", at, start=0, num=limit)
        )
        return list(keys)

    async def reschedule(self, key: str, at: float | None) -> None:
        if at is None:
            await self._plain("reschedule", self._client.zrem(self._queue, key))
        else:
            await self._plain("reschedule", self._client.zadd(self._queue, {key: at}))

    async def worker_beat(self, info: WorkerInfo, ttl: float) -> None:
        key = f"{self._ns}:worker:{info.worker_id}"
        now = await self._plain("worker_beat", self._client.time())
        seen = now[0] + now[1] / 1_000_000
        blob = orjson.dumps({**asdict(info), "last_seen": seen})
        pipe = self._client.pipeline(transaction=False)
        pipe.set(key, blob, px=int(ttl * 1000))
        pipe.zadd(f"{self._ns}:workers", {info.worker_id: seen + ttl})
        await self._plain("worker_beat", pipe.execute())

    async def worker_gone(self, worker_id: str) -> None:
        pipe = self._client.pipeline(transaction=False)
        pipe.delete(f"{self._ns}:worker:{worker_id}")
        pipe.zrem(f"{self._ns}:workers", worker_id)
        await self._plain("worker_gone", pipe.execute())

    async def list_workers(self) -> list[WorkerInfo]:
        now = await self._plain("list_workers", self._client.time())
        seen = now[0] + now[1] / 1_000_000
        index = f"{self._ns}:workers"
        await self._plain("list_workers", self._client.zremrangebyscore(index, "-inf", seen))
        ids = await self._plain("list_workers", self._client.zrange(index, 0, -1))
        out = []
        for worker_id in ids:
            blob = await self._plain(
                "list_workers", self._client.get(f"{self._ns}:worker:{worker_id}")
            )
            if blob:
                out.append(WorkerInfo(**orjson.loads(blob)))
        return out

    # -- duration history: one hash per (pipeline, kind, stage), plus an index set -----------

    async def add_durations(self, counts: Mapping[tuple[str, str, str], Mapping[int, int]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for series, buckets in counts.items():
            name = orjson.dumps(list(series)).decode()
            pipe.sadd(f"{self._ns}:hists", name)
            for bucket, n in buckets.items():
                pipe.hincrby(f"{self._ns}:hist:{name}", str(bucket), n)
        await self._plain("add_durations", pipe.execute())

    async def load_durations(self) -> dict[tuple[str, str, str], dict[int, int]]:
        names = await self._plain("load_durations", self._client.smembers(f"{self._ns}:hists"))
        out: dict[tuple[str, str, str], dict[int, int]] = {}
        for name in sorted(names):
            raw = await self._plain(
                "load_durations", self._client.hgetall(f"{self._ns}:hist:{name}")
            )
            pipeline, kind, stage = orjson.loads(name)
            out[(pipeline, kind, stage)] = {int(b): int(n) for b, n in raw.items()}
        return out

    async def wait(self, key: str, timeout: float) -> None:
        """Return on the job's next event (commit, fail, release) or after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if not hasattr(self._client, "pubsub"):  # redis-py's asyncio Cluster client: poll
            await asyncio.sleep(timeout)
            return
        pubsub = self._client.pubsub()
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
        if self._fast is not None:
            await self._fast.aclose()
        await self._client.aclose()

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r}, namespace={self._ns!r})"
