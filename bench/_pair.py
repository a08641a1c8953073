"""The baseline of the Redis benchmarks: what a careful user hand-rolls on redis-py + hiredis.

A lease with a fencing token and a fenced, idempotent commit, one script per operation:

* ``acquire``  ``INCR`` a token counter, then ``SET lock owner:token NX PX ttl``: the fence.
* ``extend``   the lock still holds our fence: ``PEXPIRE`` it (a renewal).
* ``commit``   a result already stored answers 0 (idempotent), a lock that no longer holds our
  fence answers -1 (fenced out); else the result is stored and the lock deleted: 1.

A short job is ``acquire`` + ``commit`` (2 round trips); a job that renews once adds ``extend``
(3). The client is built like ``RedisStore.from_url`` builds its own: decoded replies, 2 s
socket timeouts, redis-py's retries off. Used by bench/coordination.py and bench/lease_ops.py.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["RESULT", "Pair", "client_for"]

RESULT = '{"answer": 42}'

# KEYS: lock, token counter · ARGV: owner, ttl_ms · returns the token, or nil when held
ACQUIRE = """
local token = redis.call('INCR', KEYS[2])
if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'NX', 'PX', ARGV[2]) then
  return token
end
return false
"""
# KEYS: lock · ARGV: fence, ttl_ms · returns 1, or 0 when the lock holds another fence
EXTEND = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS: lock, result · ARGV: fence, result · returns 1 | 0 (already stored) | -1 (fenced out)
COMMIT = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
"""


def client_for(url: str) -> Any:
    """The client RedisStore.from_url builds: decoded replies, no retries, 2 s timeouts."""
    return aioredis.from_url(
        url,
        decode_responses=True,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
    )


class Pair:
    """The three scripts on one client; every refusal raises (a benchmark must not miss one)."""

    def __init__(self, client: Any, ttl_ms: int = 30_000) -> None:
        self.ttl_ms = ttl_ms
        self._acquire = client.register_script(ACQUIRE)
        self._extend = client.register_script(EXTEND)
        self._commit = client.register_script(COMMIT)

    @staticmethod
    def _lock(key: str) -> str:
        return f"pair:{{{key}}}:lock"

    async def acquire(self, key: str, owner: str) -> str:
        """The fence (``owner:token``) of a new lease on ``key``."""
        keys = [self._lock(key), f"pair:{{{key}}}:token"]
        token = await self._acquire(keys=keys, args=[owner, self.ttl_ms])
        if token is None:
            raise RuntimeError(f"bench: pair {key} was not acquired")
        return f"{owner}:{token}"

    async def extend(self, key: str, fence: str) -> None:
        if await self._extend(keys=[self._lock(key)], args=[fence, self.ttl_ms]) != 1:
            raise RuntimeError(f"bench: pair {key} extend refused")

    async def commit(self, key: str, fence: str, result: str = RESULT) -> None:
        done = await self._commit(
            keys=[self._lock(key), f"pair:{{{key}}}:result"], args=[fence, result]
        )
        if done != 1:
            raise RuntimeError(f"bench: pair {key} commit refused ({done})")
