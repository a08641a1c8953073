"""How the Redis store talks to Redis: redis-py (with hiredis as its parser), bounded.

redis-py does the protocol; this module only decides how a call is bounded, so that a slow
link does not turn into a store that times out on every call (a trap measured here):

* **A command that outlives its deadline keeps its connection.** The caller gets its
  ``TimeoutError`` at ``op_timeout``, but the command itself runs on as a task of its own
  (shielded), reads its late reply, and hands its connection back to the pool. Cancelling
  a redis-py command drops its connection instead, and a fresh one (connect + set-up) may not
  fit in the next call's deadline under 100 ms of latency. A reply that never comes ends at
  the socket timeout (twice ``op_timeout``), which drops that connection.
* **The pool is kept warm**: a few connections are opened up front under a deadline of their
  own, handed out connected ones first, and opened again in the background after a drop, so
  that a call rarely pays a connection set-up inside its own deadline.

>>> pool = WarmPool.from_url("redis://127.0.0.1:6379/0", decode_responses=True)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import RedisError

__all__ = ["WARM_CONNECTIONS", "NodePubSub", "WarmPool", "wait_message"]


WARM_CONNECTIONS = 4
"""Connections a store keeps open: spares for commands still reading a late reply."""


class WarmPool(ConnectionPool):
    """redis-py's pool, handing out a connected idle connection before a closed one.

    redis-py hands out the connection released last, which after a drop is the closed one:
    the next call would connect inside its own deadline while open ones sit idle.

    redis-py has no public way to see or order its idle connections, so this class reads two
    of the pool's own attributes, ``_available_connections`` (a list, handed out from its
    end) and ``_in_use_connections`` (a set). They are the same from redis-py 5.1 through
    8.1, and that is the range pyproject.toml allows: CI runs the Redis tests at the floor
    (5.1) and at the newest allowed release. A redis-py without them is refused when the pool
    is built, not at a call's deadline.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self, "_available_connections", None), list) or not hasattr(
            self, "_in_use_connections"
        ):
            raise RuntimeError(
                "this redis-py's connection pool has no _available_connections list: "
                "ai_lease's Redis store supports redis>=5.1,<8.2"
            )

    def get_available_connection(self) -> AbstractConnection:
        idle = self._available_connections
        for at in range(len(idle) - 1, -1, -1):
            if idle[at].is_connected:
                connection = idle.pop(at)
                self._in_use_connections.add(connection)
                return connection
        return super().get_available_connection()  # type: ignore[no-untyped-call,no-any-return]

    def idle_connected(self) -> int:
        """How many idle connections are open."""
        return sum(1 for c in self._available_connections if c.is_connected)

    async def warm(self, count: int, timeout: float) -> None:
        """Have at least ``count`` open connections, under a deadline of their own."""
        missing = count - self.idle_connected()
        if missing <= 0:
            return
        made = [self.make_connection() for _ in range(missing)]  # type: ignore[no-untyped-call]
        try:
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(c.connect() for c in made), return_exceptions=True)
        except TimeoutError:
            pass
        finally:  # open ones join the pool; the others (or all, if cancelled) are closed
            for connection in made:
                if connection.is_connected and not self._closing:
                    self._available_connections.insert(0, connection)
                else:
                    await connection.disconnect(nowait=True)

    _closing = False

    async def drop_idle(self) -> None:
        """Close every idle connection: after one went stale (a reset, a restart), the others
        most likely did too, and a resend must not meet one of them."""
        for connection in self._available_connections:
            await connection.disconnect(nowait=True)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        self._closing = True
        await super().disconnect(inuse_connections)


class NodePubSub:
    """Pub/sub for a Cluster client, on a plain connection to one of its nodes. A PUBLISH
    reaches the subscribers of every node in a Redis Cluster, so any node will do; redis-py's
    asyncio Cluster client has no ``pubsub()`` in the 5.x releases, so this one works on every
    version the package allows. One plain client per node, closed with the store."""

    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._plain: dict[tuple[str, int], Any] = {}

    def pubsub(self) -> Any:
        node = self._cluster.get_default_node()
        if node is None:  # not yet initialised: no node known
            raise OSError("the cluster has no node to subscribe on yet")
        plain = self._plain.get((node.host, node.port))
        if plain is None:
            kw = {k: v for k, v in node.connection_kwargs.items() if k != "redis_connect_func"}
            pool = ConnectionPool(connection_class=node.connection_class, **kw)
            plain = self._plain[(node.host, node.port)] = Redis.from_pool(pool)
        return plain.pubsub()

    async def aclose(self) -> None:
        plain, self._plain = list(self._plain.values()), {}
        for client in plain:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()


async def wait_message(client: Any, channel: str, timeout: float) -> None:
    """Return on the next message published on ``channel`` or after ``timeout``: one
    subscription on ``client`` (a Redis client or a :class:`NodePubSub`), closed after;
    sleeping out the timeout instead when pub/sub is unavailable (a caller then polls)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        pubsub = client.pubsub()
    except OSError:  # pub/sub unavailable: the caller polls after the timeout
        await asyncio.sleep(timeout)
        return
    try:
        async with asyncio.timeout(timeout):
            await pubsub.subscribe(channel)
            # Every read has a bound of its own too: redis-py (8.1) can lose the timeout's
            # cancellation inside subscribe's connect under load, and a read without a
            # bound then blocks until the channel's next message, which may never come.
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
