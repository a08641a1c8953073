"""How the Redis store calls Redis: the client, its scripts, and every call bounded.

The client is built with redis-py's own retries **off** (redis-py 8 retries by default: a
black-holed PING took 8-9 s to fail here, and a resent ``INCRBY`` was applied twice), and
every operation is bounded by ``op_timeout`` without losing its connection
(stores/redis/wire.py). Lost replies are handled a level up: every script is safe to run
twice. The data-loss marker (an epoch id the store keeps) is checked on every new
connection, and the specs of jobs this process may run are kept to re-create a record lost
with the data. :class:`RedisCalls` is the connection the store owns and hands to each of its parts
(:mod:`ai_lease.stores.redis.queue`, :mod:`~ai_lease.stores.redis.listing`,
:mod:`~ai_lease.stores.redis.notes`, :mod:`~ai_lease.stores.redis.slots`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoScriptError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from ai_lease import retry
from ai_lease.errors import CorruptRecord, OutcomeUnknown, StoreDataLost, StoreUnavailable
from ai_lease.stores.bounded import Tasks, within
from ai_lease.stores.redis import admin_scripts as admin_lua
from ai_lease.stores.redis import listing_scripts as list_lua
from ai_lease.stores.redis import queue_scripts as ns_lua
from ai_lease.stores.redis import scripts as lua
from ai_lease.stores.redis import slot_scripts as slot_lua
from ai_lease.stores.redis.keys import job_keys, untag
from ai_lease.stores.redis.wire import WARM_CONNECTIONS, NodePubSub, WarmPool

__all__ = ["RedisCalls", "connect"]

log = logging.getLogger("ai_lease.store")

_SCRIPTS = {  # each script by name, from the module that holds its text
    **{name: lua for name in ("ACQUIRE", "RENEW", "RELEASE", "FINISH", "REPORT_STALL")},
    **{name: lua for name in ("CANCEL", "GET", "SUBMIT", "NOTE")},
    **{name: admin_lua for name in ("RETRY", "REMOVE", "PRUNE")},
    **{name: ns_lua for name in ("EPOCH", "DUE", "RESCHEDULE", "RECOVER_AT", "DUE_RECOVERIES")},
    "LOOK": ns_lua,
    **{name: ns_lua for name in ("BEAT", "WORKER_GONE", "LIST_WORKERS")},
    **{name: list_lua for name in ("LIST_PAGE", "BACKFILL", "COUNT_JOBS")},
    **{name: slot_lua for name in ("ACQUIRE_SLOT", "RENEW_SLOT", "RELEASE_SLOT", "SLOT_STATE")},
    "PAUSE_SLOT": slot_lua,
    "REWEIGH_SLOT": slot_lua,
}
# Job scripts that also keep the namespace's keys: the lease index, the queue (SUBMIT, RETRY,
# REMOVE, LOOK, FINISH), the recovery looks (RETRY, REMOVE, LOOK, FINISH), the creation index
# and its counts.
_INDEXED = frozenset(
    {"ACQUIRE", "RENEW", "RELEASE", "FINISH", "CANCEL", "SUBMIT", "RETRY", "REMOVE", "LOOK"}
)
# Specs remembered to write back into a record re-created after a data loss.
_SPECS_KEPT, _SPEC_CHARS_KEPT = 64, 32 * 1024 * 1024


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


IN_FLIGHT = 128
"""Calls a store has on the wire at once; more wait their turn before their deadline starts.
The pool itself is unbounded (as redis-py's was before 8, whose default of 100 fails the
101st concurrent call at once): a call that gave up at its deadline still holds its
connection while it reads the late reply, so the pool may need a few more than this."""


def _never_sent(exc: BaseException) -> bool:
    """True when the error proves the command never reached the server."""
    text = str(exc)
    return (
        isinstance(exc, AuthenticationError)
        or "Connection refused" in text
        or "Error connecting" in text
        or "Timeout connecting" in text
    )


def connect(url: str, op_timeout: float) -> Any:
    """A redis-py client for ``redis://``, ``rediss://``, ``unix://`` or, for Redis
    Cluster, ``redis+cluster://`` / ``rediss+cluster://`` — with redis-py's retries off."""
    options: dict[str, Any] = dict(
        decode_responses=True,
        # A reply later than op_timeout is still read (its caller has given up) for as
        # long again; one that never comes drops its connection then.
        socket_timeout=2 * op_timeout,
        socket_connect_timeout=op_timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        max_connections=2**31,
        **_NO_SETINFO,
    )
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        from redis.asyncio.cluster import RedisCluster

        plain = url.replace("+cluster://", "://", 1)
        return RedisCluster.from_url(plain, **options)
    pool = WarmPool.from_url(url, retry_on_timeout=False, **options, **_POOL_OPTIONS)
    return aioredis.Redis.from_pool(pool)


class RedisCalls:
    """The client, its scripts and the bounded calls every part of the Redis store makes."""

    def __init__(
        self,
        client: Any,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        where: str = "redis",
        create: bool = True,
    ) -> None:
        self._client, self._ns, self._op_timeout, self.where = client, namespace, op_timeout, where
        self._create = create  # False (a look): the marker keys are read, never written
        self._prepared, self._prepare_lock = False, asyncio.Lock()
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._cluster = hasattr(client, "get_nodes")
        self._scripts = {
            name: client.register_script(getattr(module, name)) for name, module in _SCRIPTS.items()
        }
        tag = f"{{{namespace}:queue}}"  # the slot of "<ns>:queue" itself
        self._queue, self._leases = f"{namespace}:queue", f"{tag}:leases"
        self._marks = [f"{tag}:epoch", f"{tag}:data_lost"]
        self._recovery = f"{tag}:recovery"  # the looks at RUNNING jobs, asked for first
        # The creation index and its per-status counts (stores/redis/listing.py).
        self._created, self._counts = f"{tag}:created", f"{tag}:counts"
        self._names = f"{tag}:names"
        self._epoch: str | None = None  # the epoch this process saw first
        self.lost_data: StoreDataLost | None = None
        """Set once this process has seen the store lose its data (or a recent note of it)."""
        self._specs: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._spec_chars = 0
        # Commands still reading a late reply, and the pool's re-warming (stores/redis/wire.py).
        self._tasks, self._rewarming = Tasks(), False
        pool = getattr(client, "connection_pool", None)
        self._pool = pool if isinstance(pool, WarmPool) else None
        self._pubsub: Any = NodePubSub(client) if self._cluster else client
        if pool is not None and not self._cluster:
            # Pub/sub closes its connection after each wait: a pool of its own, so that it
            # never takes (and closes) one of the warm ones.
            kw = dict(pool.connection_kwargs)
            if self._pool is not None:
                plain = ConnectionPool(connection_class=pool.connection_class, **kw)
                self._pubsub = aioredis.Redis.from_pool(plain)
            # The data-loss marker is checked on every new connection, as it is set up.
            pool.connection_kwargs.setdefault("redis_connect_func", self._set_up)

    def keys(self, key: str) -> list[str]:
        """The Redis keys of one job: its hash and its event channel (one hash tag)."""
        return job_keys(self._ns, key)

    def _key_of(self, name: str) -> str:
        """The job key of a job hash's name (the inverse of ``keys(key)[0]``)."""
        return untag(name[len(self._ns) + 2 : -len("}:job")])

    def _script_keys(self, key: str, script: str) -> list[str]:
        keys = self.keys(key)
        if self._cluster:  # the namespace's keys are in another slot
            return keys
        if script in _INDEXED:  # every namespace key a job script may keep
            keys += [self._leases, self._queue, self._recovery]
            keys += [self._created, self._counts, self._names]
        return keys

    # -- the data-loss marker ------------------------------------------------------------

    def _epoch_args(self) -> list[str]:
        """The expected epoch and a fresh one to write if there is none ('': a look)."""
        return [self._epoch or "", secrets.token_hex(8) if self._create else ""]

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
                await connection.send_command("EVAL", ns_lua.EPOCH, 2, *args)
                reply = await connection.read_response()
        except ResponseError:  # a read-only replica, an ACL: costs the check, not the link
            return
        self._saw_epoch(reply)

    def _saw_epoch(self, reply: Any) -> None:
        epoch, note = reply[0], reply[1]
        if self._epoch is None:
            self._epoch = epoch or None  # '': a look found no marker (and wrote none)
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
                return await execute("EVAL", self._scripts[script].script, count, *keys, *args)

        return await self._bounded(op, key, run)

    async def _cmd(self, op: str, *args: Any) -> Any:
        """One plain command, bounded like every script."""
        return await self._bounded(op, "", lambda: self._client.execute_command(*args))

    async def _bounded(
        self, op: str, key: str, run: Callable[[], Awaitable[Any]], *, resend: bool = True
    ) -> Any:
        """One call bounded by op_timeout. Calls beyond :data:`IN_FLIGHT` wait their turn
        first, unbounded (as the PostgreSQL store's do): the deadline bounds the store, not
        this process's own backlog."""
        if not self._prepared:
            await self._prepare()
        async with self._slots:
            return await self._bounded_now(op, key, run, resend=resend)

    async def _bounded_now(
        self, op: str, key: str, run: Callable[[], Awaitable[Any]], *, resend: bool
    ) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout

        sends = 0

        async def send() -> Any:
            # A resend follows a stale connection (e.g. the server restarted): it goes out on
            # another connection, inside the same deadline; every script is safe to run
            # twice, so a command that did land is not applied differently. The idle
            # connections went stale with it (most likely): closed, then re-opened in the
            # background.
            nonlocal sends
            sends += 1
            if sends > 1 and self._pool is not None:
                await self._pool.drop_idle()
                self._rewarm()
            return await run()

        def attempt() -> Awaitable[Any]:
            if not resend:
                return run()
            past = lambda: loop.time() >= deadline  # noqa: E731
            return retry.resend(send, retry.STALE_CONNECTION, RedisConnectionError, until=past)

        try:
            # The deadline ends the wait, not the command: it reads its late reply and
            # gives its connection back (stores/redis/wire.py).
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

    # -- the specs kept against a data loss -----------------------------------------------

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

    # -- shared by the parts ---------------------------------------------------------------

    async def _unqueue(self, key: str) -> None:
        """On Cluster, a removed job's entries in the namespace's sorted sets."""
        await self._cmd("remove", "ZREM", self._leases, self.keys(key)[0])
        await self._cmd("remove", "ZREM", self._queue, key)
        await self._cmd("remove", "ZREM", self._recovery, key)

    async def _job_hashes(self, batch: int) -> AsyncIterator[list[str]]:
        """The namespace's job hashes, SCANned in batches of at most ``batch``."""
        match = f"{self._ns}:{{*}}:job"
        if self._cluster:
            names: list[str] = []
            async for name in self._client.scan_iter(match=match, count=batch):
                names.append(name)
            for at in range(0, len(names), batch):
                yield names[at : at + batch]
            return
        cursor = "0"
        while True:
            cursor, names = await self._cmd("prune", "SCAN", cursor, "MATCH", match, "COUNT", batch)
            for at in range(0, len(names), batch):
                yield names[at : at + batch]
            if int(cursor) == 0:
                return

    async def aclose(self) -> None:
        await self._tasks.aclose()
        if self._pubsub is not self._client:
            await self._pubsub.aclose()
        await self._client.aclose()
