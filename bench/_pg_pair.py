"""The PostgreSQL benches' baseline: what a careful user hand-rolls on psycopg 3 (async).

A lease with a fencing token and a fenced, idempotent commit, one plpgsql function per
operation in a schema of its own, each called by one ``SELECT`` in autocommit (one round
trip, one transaction):

* ``pair_acquire``  insert the key's row (token 1), or take it over (token + 1) when its
  lease has expired by the server's clock (``now()``) and no result is stored; a live lease
  or a stored result answers NULL (refused). The lease expires ``ttl_ms`` after ``now()``.
* ``pair_commit``   compare-and-set on owner + token: a row that still holds our fence and no
  result gets the result and its lease cleared: 1; a result already stored answers 0
  (idempotent), a fence that is not the row's -1 (fenced out).

A short job is ``pair_acquire`` + ``pair_commit`` (2 round trips). The table and functions
are named with their schema (no ``SET search_path`` on the functions: nothing to save and
restore per call). Durability is the cluster's, as the store's: fsync per the cluster, the
default ``synchronous_commit`` (on; the store's lease functions keep it too).

The connections are made as ``PostgresStore`` makes its own (ai_lease/stores/postgres/conn.py
and checks.py), written out here: a psycopg_pool ``AsyncConnectionPool`` of 2 to 20
connections in autocommit, psycopg's default statement preparation, the pool's wait bounded by
the op timeout (2 s), and the server-side bounds in the startup ``options``
(``statement_timeout`` and ``lock_timeout`` at 0.9 x the op timeout,
``idle_in_transaction_session_timeout``), a connect timeout and TCP keepalives. Used by
bench/coordination.py.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

__all__ = ["RESULT", "PgPair", "conninfo_for"]

RESULT = '{"answer": 42}'

_SCHEMA = """
CREATE SCHEMA {s};
CREATE TABLE {s}.locks (
  key text PRIMARY KEY,
  owner text,
  token bigint NOT NULL,
  expires_at timestamptz,
  result text
);
CREATE FUNCTION {s}.pair_acquire(p_key text, p_owner text, p_ttl_ms int)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_token bigint;
BEGIN
  INSERT INTO {s}.locks AS l (key, owner, token, expires_at)
  VALUES (p_key, p_owner, 1, now() + p_ttl_ms * interval '1 millisecond')
  ON CONFLICT (key) DO UPDATE
    SET owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at
    WHERE l.result IS NULL AND l.expires_at <= now()
  RETURNING l.token INTO v_token;
  RETURN v_token;  -- NULL: a live lease or a stored result holds the key
END $$;
CREATE FUNCTION {s}.pair_commit(p_key text, p_owner text, p_token bigint, p_result text)
RETURNS int LANGUAGE plpgsql AS $$
BEGIN
  UPDATE {s}.locks SET result = p_result, owner = NULL, expires_at = NULL
  WHERE key = p_key AND owner = p_owner AND token = p_token AND result IS NULL;
  IF FOUND THEN RETURN 1; END IF;
  PERFORM 1 FROM {s}.locks WHERE key = p_key AND result IS NOT NULL;
  RETURN CASE WHEN FOUND THEN 0 ELSE -1 END;
END $$;
"""


def conninfo_for(url: str, op_timeout: float = 2.0) -> str:
    """The connection string PostgresStore.from_url builds: server-side bounds a little
    under the op timeout, an application name, a connect timeout, TCP keepalives."""
    ms = max(1, round(op_timeout * 900))
    options = (
        f"-c statement_timeout={ms} -c lock_timeout={ms} "
        f"-c idle_in_transaction_session_timeout={max(ms * 5, 10_000)}"
    )
    return make_conninfo(
        url,
        options=options,
        application_name="pair",
        connect_timeout=max(2, round(op_timeout * 2)),
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
    )


class PgPair:
    """The two functions on one pool; every refusal raises (a benchmark must not miss one).
    ``await open()`` creates the schema (which must not exist) and opens the pool."""

    def __init__(
        self, url: str, schema: str, ttl_ms: int = 30_000, op_timeout: float = 2.0
    ) -> None:
        self.ttl_ms = ttl_ms
        self._conninfo = conninfo_for(url, op_timeout)
        self._schema = '"' + schema.replace('"', '""') + '"'
        self._acquire = f"SELECT {self._schema}.pair_acquire(%s, %s, %s)".encode()
        self._commit = f"SELECT {self._schema}.pair_commit(%s, %s, %s, %s)".encode()
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self._conninfo,
            min_size=2,
            max_size=20,
            kwargs={"autocommit": True},
            timeout=op_timeout,
            open=False,
            name="pair",
        )

    async def open(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            await conn.execute(_SCHEMA.replace("{s}", self._schema).encode())
        await self._pool.open(wait=True)

    async def _one(self, query: bytes, params: tuple[Any, ...]) -> Any:
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
        return None if row is None else row[0]

    async def acquire(self, key: str, owner: str) -> int:
        """The fencing token of a new lease on ``key``."""
        token = await self._one(self._acquire, (key, owner, self.ttl_ms))
        if token is None:
            raise RuntimeError(f"bench: pg pair {key} was not acquired")
        return int(token)

    async def commit(self, key: str, owner: str, token: int, result: str = RESULT) -> None:
        done = await self._one(self._commit, (key, owner, token, result))
        if done != 1:
            raise RuntimeError(f"bench: pg pair {key} commit refused ({done})")

    async def aclose(self) -> None:
        await self._pool.close()
