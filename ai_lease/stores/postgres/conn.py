"""How the PostgreSQL store talks to PostgreSQL: psycopg 3 (async) and a psycopg_pool pool.

Every operation is one statement in autocommit mode (a lease operation is one plpgsql
function call, which is one transaction), so a call costs one round trip: the server-side
bounds (``statement_timeout``, ``lock_timeout``, ``idle_in_transaction_session_timeout``)
are set once per connection in its startup ``options``, never by a statement per call, and
the client bounds the whole call by ``op_timeout`` as well (a black-holed link). A call whose
connection went stale (a restarted server, ``pg_terminate_backend``) is sent once more on
another connection within the same deadline when it is safe to run twice (a repeated
acquire by the same owner returns its token; a repeated commit of the same fence answers
with the stored record); the two that are not (adding to the duration counts, appending a
note) are sent once, and a broken connection is a :class:`StoreUnavailable`. psycopg errors
become :class:`StoreUnavailable` or, for what no retry fixes (a bad URL, bad credentials, no
right to create the schema, a foreign table of our name), :class:`ConfigError` — both
naming the URL with its password masked — or, for values the server refuses,
:class:`ValueError` (a NUL in text never reaches it: lease/storable.py escapes or refuses
it first).

The first call of a store object connects once on its own, so that a refusal reads as
libpq's own message, and applies the migration unless the schema is at its version
(stores/postgres/schema.py) — or, for a store opened with ``create=False`` (a look), changes
nothing: no schema is :class:`StoreMissing`, one at another version a :class:`ConfigError`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import psycopg.errors as pg_errors
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ai_lease import retry
from ai_lease.errors import (
    ConfigError,
    CorruptRecord,
    OutcomeUnknown,
    StoreMissing,
    StoreUnavailable,
)
from ai_lease.job import JobState
from ai_lease.redaction import mask_url
from ai_lease.resource import AsyncResource
from ai_lease.stores.bounded import Tasks, within
from ai_lease.stores.postgres import schema as schema_
from ai_lease.stores.postgres.checks import check_namespace, check_url, job_key, with_bounds
from ai_lease.stores.postgres.schema import JOB_COLUMNS

__all__ = ["PostgresConn", "check_url", "job_key"]

POOL_SIZE = (2, 20)
"""The pool's least and most connections per store object."""

# libpq's refusals that no retry fixes: credentials, names, options.
_CONFIG_PROBLEMS = re.compile(
    r"(?i)password authentication failed|authentication failed|role \S+ does not exist|"
    r"database \S+ does not exist|no pg_hba\.conf entry|password is required|"
    r"invalid (?:integer )?value|invalid connection option|invalid sslmode|"
    r"permission denied for database|is not permitted to log in"
)


_BAD_INPUT = (psycopg.DataError, pg_errors.ProgramLimitExceeded, pg_errors.InvalidParameterValue)
"""What the server (or psycopg, for a NUL in text) refuses of the values themselves:
SQLSTATE class 22 (data exceptions, InvalidParameterValue among them) and class 54 (a
program limit exceeded). Bad input, not an unavailable store."""


class _Stale(Exception):
    """A call's connection broke under it (the cause is psycopg's error): send again."""


class PostgresConn(AsyncResource):
    """The pool, the bounded calls and the record decoding: the connection the store owns
    and hands to each of its parts (stores/postgres/queue.py, stores/postgres/listing.py,
    stores/postgres/notes.py)."""

    def __init__(
        self,
        conninfo: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = 2.0,
        poll_interval: float = 0.05,
        where: str | None = None,
        create: bool = True,
    ) -> None:
        if not namespace:
            raise ConfigError("store.namespace: must not be empty for a PostgreSQL store")
        check_namespace(namespace)
        self.where = where or mask_url(conninfo)
        self.namespace = namespace
        self.schema = '"' + namespace.replace('"', '""') + '"'  # sql.Identifier's quoting
        self._op_timeout, self._poll, self._create = op_timeout, poll_interval, create
        self._conninfo = with_bounds(conninfo, op_timeout, self.where)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._ready_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(POOL_SIZE[1])  # calls in flight: one per connection
        self._tasks = Tasks()  # calls still running after their caller's deadline
        self._closing: set[asyncio.Task[None]] = set()  # pools forgotten, still closing
        self._queries: dict[str, bytes] = {}
        self._closed = False

    # -- connecting ---------------------------------------------------------------------------

    async def _ready(self, op: str) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        """The pool, once the schema is known to be at its version (first call only)."""
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise StoreUnavailable(self.where, op, "the store is closed", maybe_applied=False)
        async with self._ready_lock:
            if self._pool is None:
                await self._check_and_migrate(op)
                pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
                    self._conninfo,
                    min_size=POOL_SIZE[0],
                    max_size=POOL_SIZE[1],
                    kwargs={"autocommit": True},
                    timeout=self._op_timeout,
                    open=False,
                    name=f"ai_lease:{self.namespace}",
                )
                await pool.open(wait=False)
                self._pool = pool
        return self._pool

    async def _connect(self, op: str, *, autocommit: bool = True) -> psycopg.AsyncConnection[Any]:
        """One connection of its own (the first check, ``migrate``, the listener), bounded,
        its refusal typed."""
        try:
            async with asyncio.timeout(max(self._op_timeout, 1.0) * 2):
                return await psycopg.AsyncConnection.connect(self._conninfo, autocommit=autocommit)
        except TimeoutError:
            raise StoreUnavailable(
                self.where,
                op,
                f"no connection within {self._op_timeout * 2:g}s",
                maybe_applied=False,
            ) from None
        except psycopg.Error as exc:
            raise self._refused(op, exc) from None

    def _refused(self, op: str, exc: psycopg.Error) -> ConfigError | StoreUnavailable:
        detail = _one_line(str(exc))
        if _CONFIG_PROBLEMS.search(detail) or isinstance(exc, psycopg.ProgrammingError):
            return ConfigError(f"store.url {self.where!r}: {detail}")
        return StoreUnavailable(self.where, op, detail, maybe_applied=False)

    async def _check_and_migrate(self, op: str) -> None:
        conn = await self._connect(op, autocommit=True)
        try:
            version = await schema_.installed(conn, self.namespace)
            if version != schema_.VERSION and not self._create:
                raise self._not_installed(version)
            if version != schema_.VERSION:
                await schema_.migrate(conn, self.namespace, self.where)
        except pg_errors.InsufficientPrivilege as exc:  # e.g. no USAGE on the schema
            raise ConfigError(f"store.url {self.where!r}: {_one_line(str(exc))}") from None
        except pg_errors.UndefinedColumn:  # an ail_migrations table that is not ours
            raise ConfigError(
                f"store.url {self.where!r}: schema {self.namespace!r} holds an ail_migrations "
                "table ai_lease did not make: use another namespace (store.namespace)"
            ) from None
        except psycopg.Error as exc:
            raise StoreUnavailable(
                self.where, op, _one_line(str(exc)), maybe_applied=False
            ) from exc
        finally:
            await conn.close()

    def _not_installed(self, version: int | None) -> StoreMissing | ConfigError:
        """What a look says of a schema not at
        :data:`~ai_lease.stores.postgres.schema.VERSION` (it changes nothing: no schema, or
        one another ai_lease made)."""
        if version is None:
            return StoreMissing(
                self.where,
                f"no ai_lease schema in {self.where} (namespace {self.namespace!r}); "
                "`ai-lease submit`, `ai-lease worker` or `ai-lease migrate` creates it",
            )
        return ConfigError(
            f"store.url {self.where!r}: schema {self.namespace!r} is at migration {version}, "
            f"this ai_lease knows {schema_.VERSION}: `ai-lease migrate` (or a newer ai_lease) "
            "first; a look changes nothing"
        )

    async def migrate(self) -> bool:
        """Apply the schema's migration now (``ai-lease migrate``); True when this call
        applied it, False when it was already there."""
        conn = await self._connect("migrate")
        try:
            return await schema_.migrate(conn, self.namespace, self.where)
        except psycopg.Error as exc:
            raise self._refused("migrate", exc) from exc
        finally:
            await conn.close()

    # -- calls ----------------------------------------------------------------------------------

    def _query(self, query: str) -> bytes:
        """``query`` with ``{schema}`` replaced by the quoted schema name (kept per text);
        a ``%`` in the name doubled, as psycopg reads the text for its ``%s`` placeholders
        (every call passes parameters, if only ``()``, so the text is always read so)."""
        text = self._queries.get(query)
        if text is None:
            schema = self.schema.replace("%", "%%")
            text = self._queries[query] = query.replace("{schema}", schema).encode()
        return text

    async def _fetch(
        self, op: str, query: str, params: Sequence[Any] = (), *, resend: bool = True
    ) -> list[tuple[Any, ...]]:
        """Run one statement (one round trip) and return its rows; bounded by op_timeout,
        sent again once on another connection if its own went stale — unless ``resend``
        is False: a statement that is not safe to run twice (adding to the duration
        counts, appending a note) may have committed before its connection broke.

        Calls beyond the pool's size queue here first, unbounded (as SQLite's queue for its
        thread is): the deadline bounds the store, not this process's own backlog."""
        pool = await self._ready(op)
        async with self._slots:
            return await self._send(op, pool, self._query(query), params, resend)

    async def _send(
        self,
        op: str,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        text: bytes,
        params: Sequence[Any],
        resend: bool,
    ) -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout
        sends = 0

        async def send() -> list[tuple[Any, ...]]:
            nonlocal sends
            sends += 1
            if sends > 1:  # the others idle beside it most likely went stale too
                await pool.check()
            async with pool.connection(timeout=max(0.001, deadline - loop.time())) as conn:
                try:
                    cur = await conn.execute(text, params, prepare=None)
                    return await cur.fetchall()
                except psycopg.OperationalError as exc:
                    if conn.broken or conn.closed:
                        raise _Stale(str(exc)) from exc
                    raise

        past = lambda: loop.time() >= deadline  # noqa: E731
        call = retry.resend(send, retry.STALE_CONNECTION, _Stale, until=past) if resend else send()
        try:
            # The deadline ends the wait, not the call: cancelling a psycopg call makes it
            # send the server a cancel request and wait for that (seconds, against a frozen
            # server). The call runs on in the background and gives its connection back
            # when its answer (or its error) comes; aclose() ends what is still running.
            return await within(self._tasks.start(call), max(0.0, deadline - loop.time()))
        except TimeoutError:
            detail = f"no answer within {self._op_timeout:g}s"
            raise self._unavailable(op, detail, key=_key_of(params)) from None
        except PoolTimeout:
            detail = f"no connection within {self._op_timeout:g}s"
            raise self._unavailable(op, detail, maybe_applied=sends > 1) from None
        except _Stale as exc:
            detail = f"connection lost: {_one_line(str(exc))}"
            raise self._unavailable(op, detail, key=_key_of(params)) from exc
        except psycopg.Error as exc:
            raise self._translate(op, exc) from exc

    def _translate(self, op: str, exc: psycopg.Error) -> Exception:
        """The typed error for a statement the server refused (it was rolled back)."""
        if isinstance(exc, pg_errors.UndefinedTable | pg_errors.UndefinedFunction):
            self._forget_pool()  # the schema went away (dropped): the next call re-creates it
        if isinstance(exc, pg_errors.QueryCanceled | pg_errors.LockNotAvailable):
            detail = f"no answer within {self._op_timeout:g}s ({_primary(exc)})"
            return self._unavailable(op, detail, maybe_applied=False)
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return ConfigError(f"store.url {self.where!r}: {_primary(exc)}")
        if isinstance(exc, pg_errors.RaiseException) and (
            exc.diag.message_primary == "AILEASE_CORRUPT"  # ail_ours(): not a job record
        ):
            detail = exc.diag.message_detail or "not a job record"
            return CorruptRecord(exc.diag.message_hint or "", detail[:120])
        if isinstance(exc, _BAD_INPUT):  # the same input fails the same way: no retry
            return ValueError(
                f"{op}: the store refused the input ({_primary(exc)[:200]}); nothing was written"
            )
        return self._unavailable(op, _primary(exc), maybe_applied=False)

    async def _fetchone(
        self, op: str, query: str, params: Sequence[Any] = (), *, resend: bool = True
    ) -> tuple[Any, ...] | None:
        rows = await self._fetch(op, query, params, resend=resend)
        return rows[0] if rows else None

    def _unavailable(
        self, op: str, detail: str, *, maybe_applied: bool = True, key: str = ""
    ) -> StoreUnavailable:
        if maybe_applied and op == "submit":  # the caller must be told it may be stored
            return OutcomeUnknown(self.where, op, detail, key=key)
        return StoreUnavailable(self.where, op, detail, maybe_applied=maybe_applied)

    def _forget_pool(self) -> None:
        """Drop the pool (the schema went away); it closes in the background, and
        :meth:`aclose` waits for that (no connection left open behind a closed store)."""
        if self._closed:  # aclose() closes whatever pool is left
            return
        pool, self._pool = self._pool, None
        if pool is not None:
            self._closing.add(self._tasks.start(pool.close()))

    # -- records --------------------------------------------------------------------------------

    def _job(self, row: Mapping[str, Any] | Sequence[Any], now: float) -> JobState:
        """A row of the jobs table (in :data:`JOB_COLUMNS` order) as a job read at ``now``;
        :class:`CorruptRecord` when it does not decode."""
        data = row if isinstance(row, Mapping) else dict(zip(JOB_COLUMNS, row, strict=False))
        key = data.get("key")
        if not isinstance(key, str):
            raise CorruptRecord(str(key), "row has no key")
        return JobState.from_fields(key, data, float(now))

    async def aclose(self) -> None:
        self._closed = True
        closing, self._closing = self._closing, set()
        await asyncio.gather(*closing, return_exceptions=True)  # ran to the end, not cancelled
        await self._tasks.aclose()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r}, namespace={self.namespace!r})"


def _key_of(params: Sequence[Any]) -> str:
    """The job key a call names (its first argument, by convention), for OutcomeUnknown."""
    return params[0] if params and isinstance(params[0], str) else ""


def _primary(exc: psycopg.Error) -> str:
    """The server's message for a refused statement (without its PL/pgSQL context)."""
    return _one_line(exc.diag.message_primary or str(exc))


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]
