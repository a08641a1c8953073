"""The SQLite benches' baseline: what a careful user writes on the standard library's sqlite3.

A fenced lease and an idempotent fenced commit, in the store's process style and with its
durability: one connection on one thread beside the event loop (``run_in_executor``), WAL,
``synchronous=NORMAL``, autocommit off (``isolation_level=None`` and an explicit
``BEGIN IMMEDIATE`` per operation).

* ``acquire``  read the lock row, refuse a live lease or a stored result, else write owner +
  next fencing token + expiry.
* ``commit``   read the row, refuse a fence that is not ours or a result already stored, else
  store the result and clear the lease.

Two write transactions per job, as the store's. Used by bench/sqlite_pair.py and
bench/coordination.py.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["RESULT", "SqlitePair"]

RESULT = '{"answer": 42}'

_PAIR_SCHEMA = """
CREATE TABLE IF NOT EXISTS pair_locks (
    key TEXT PRIMARY KEY,
    owner TEXT,
    token INTEGER NOT NULL,
    expires_at REAL,
    result TEXT
)
"""


class SqlitePair:
    """A fenced lease and an idempotent fenced commit on sqlite3, one thread, one connection."""

    def __init__(self, path: Path, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pair-sqlite")
        self._conn = sqlite3.connect(
            path, timeout=2.0, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(_PAIR_SCHEMA)

    async def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        def work() -> Any:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                answer = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return answer

        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def acquire(self, key: str, owner: str) -> int:
        def fn(conn: sqlite3.Connection) -> int:
            now = time.time()
            row = conn.execute(
                "SELECT owner, token, expires_at, result FROM pair_locks WHERE key = ?", (key,)
            ).fetchone()
            if row is not None and (row[3] is not None or (row[2] or 0) > now):
                raise RuntimeError(f"bench: pair {key} was not acquired")
            token = max((row[1] if row else 0) + 1, int(now * 1_000_000))
            conn.execute(
                "INSERT INTO pair_locks VALUES (?, ?, ?, ?, NULL) ON CONFLICT(key) DO UPDATE"
                " SET owner = excluded.owner, token = excluded.token,"
                " expires_at = excluded.expires_at",
                (key, owner, token, now + self.ttl),
            )
            return token

        return int(await self._write(fn))

    async def commit(self, key: str, owner: str, token: int, result: str = RESULT) -> None:
        def fn(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT owner, token, result FROM pair_locks WHERE key = ?", (key,)
            ).fetchone()
            if row is None or row[2] is not None or (row[0], row[1]) != (owner, token):
                raise RuntimeError(f"bench: pair {key} commit refused ({row!r})")
            conn.execute(
                "UPDATE pair_locks SET result = ?, owner = NULL, expires_at = NULL WHERE key = ?",
                (result, key),
            )

        await self._write(fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._conn.close()
