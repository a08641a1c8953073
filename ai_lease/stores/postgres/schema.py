"""The PostgreSQL store's schema and its versioned migration.

Everything lives in one PostgreSQL schema named after the store's namespace: the tables
below, the fencing-token sequence and the lease functions (stores/postgres/lease_sql.py, the
queue's in stores/postgres/queue_sql.py, the slots' tables and functions in
stores/postgres/slots_sql.py). A migration version table says what is installed; the store
applies the migration on first use and ``ai-lease migrate`` applies it explicitly, both in
one transaction under an advisory lock, so processes starting at once wait for the first one
and then find it done. A schema that already holds a table of our name but no
version table is somebody else's: the store refuses it and changes nothing.

Every function is created with ``SET search_path FROM CURRENT`` while the migration's
search path is ``<schema>, pg_catalog``: the functions name tables unqualified and still
never pick up a caller's same-named table. The SQL parts may hold ``{channel}`` (the
NOTIFY channel as a string literal), replaced before they run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
from psycopg import sql

from ai_lease.errors import ConfigError
from ai_lease.stores.postgres import lease_sql, queue_sql, slots_sql

__all__ = [
    "DDL",
    "JOB_COLUMNS",
    "PARTS",
    "PAYLOAD_LIMIT",
    "VERSION",
    "channel_name",
    "migrate",
    "notify_payload",
]

VERSION = 7
"""The migration this code installs and expects (2: ``failure_kind``; 3: timeline entries
numbered from the timeline itself, no ``ail_timeline_heads``; 4: ``ail_look``, and a commit
or fail takes the job off the queue; 5: provider slots, stores/postgres/slots_sql.py; 6: their
pauses; 7: their weights; see :data:`UPGRADES`)."""

UPGRADES: dict[int, str] = {
    2: "ALTER TABLE ail_jobs ADD COLUMN failure_kind text;",
    # The next entry's seq is the key's last one + 1 (read under the job's row lock): the
    # heads table's upsert per entry went; the entries already written keep their numbers.
    3: "DROP TABLE IF EXISTS ail_timeline_heads;",
    # Functions only: a worker's look in one call (ail_look), and ail_finish unqueues.
    4: "SELECT 1;",
    5: slots_sql.TABLES,  # provider slots: their tables (and functions, made below)
    6: slots_sql.PAUSES,  # a limit paused by a 429 grants nothing until the pause ends
    7: slots_sql.WEIGHTS,  # a slot may take several units (a tokens-per-minute window)
}
"""What takes a schema from the version before each key to it: the tables' changes; the
functions are then made again from this code's SQL (:func:`_upgrade`)."""

JOB_COLUMNS: tuple[str, ...] = (
    *("key", "status", "owner_id", "token", "stage", "progress_version", "heartbeat_at"),
    *("last_progress_at", "lease_expires_at", "max_no_progress", "stall_policy"),
    *("renew_interval", "attempts", "takeovers", "takeover_cause", "stalled_attempt"),
    *("missed_renewals", "last_error", "last_error_attempt", "last_error_owner"),
    *("stall_snapshot", "fingerprint", "spec", "result", "created_at", "updated_at"),
    *("started_at", "finish_reason", "finished_at", "provider", "model", "prompt_tokens"),
    *("completion_tokens", "reasoning_tokens", "first_token_s", "first_visible_s"),
    *("stage_durations", "checkpoint", "failure_kind"),
)
"""The jobs table's columns in order: what every function returning a job returns."""

DDL = """
CREATE SEQUENCE ail_tokens;
CREATE TABLE ail_jobs (
  key text COLLATE "C" PRIMARY KEY, status text NOT NULL, owner_id text,
  token bigint NOT NULL DEFAULT 0,
  stage text, progress_version bigint NOT NULL DEFAULT 0, heartbeat_at double precision,
  last_progress_at double precision, lease_expires_at double precision,
  max_no_progress double precision, stall_policy text NOT NULL DEFAULT 'expire',
  renew_interval double precision, attempts int NOT NULL DEFAULT 0,
  takeovers int NOT NULL DEFAULT 0, takeover_cause text, stalled_attempt int NOT NULL DEFAULT 0,
  missed_renewals int NOT NULL DEFAULT 0, last_error text, last_error_attempt int,
  last_error_owner text, stall_snapshot text, fingerprint text, spec text, result text,
  created_at double precision NOT NULL, updated_at double precision NOT NULL,
  started_at double precision, finish_reason text, finished_at double precision,
  provider text, model text, prompt_tokens int, completion_tokens int, reasoning_tokens int,
  first_token_s double precision, first_visible_s double precision, stage_durations text,
  checkpoint text, failure_kind text
);
CREATE INDEX ail_jobs_by_expiry ON ail_jobs (status, lease_expires_at);
CREATE INDEX ail_jobs_by_created ON ail_jobs (created_at DESC, key DESC);
CREATE INDEX ail_jobs_by_status_created ON ail_jobs (status, created_at DESC, key DESC);
CREATE TABLE ail_queue (key text COLLATE "C" PRIMARY KEY, due_at double precision NOT NULL);
CREATE INDEX ail_queue_by_due ON ail_queue (due_at);
CREATE TABLE ail_recovery (key text COLLATE "C" PRIMARY KEY, due_at double precision NOT NULL);
CREATE INDEX ail_recovery_by_due ON ail_recovery (due_at);
CREATE TABLE ail_durations (pipeline text, kind text, stage text, bucket int,
  count bigint NOT NULL, PRIMARY KEY (pipeline, kind, stage, bucket));
CREATE TABLE ail_timeline (key text COLLATE "C", seq int, at double precision NOT NULL,
  kind text NOT NULL, owner_id text NOT NULL, token bigint NOT NULL,
  stage text NOT NULL, detail text NOT NULL,
  PRIMARY KEY (key, seq));
CREATE TABLE ail_workers (worker_id text PRIMARY KEY, expires_at double precision NOT NULL,
  info text NOT NULL);

-- The store's clock: the database's, in epoch seconds (read once per operation).
CREATE FUNCTION ail_now() RETURNS double precision LANGUAGE sql VOLATILE
AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

-- Wake the job's followers (LISTEN on the namespace's channel): the key as the payload, or
-- its digest for a key over %PAYLOAD_LIMIT% bytes (NOTIFY refuses 8000), see notify_payload().
CREATE FUNCTION ail_notify(p_key text) RETURNS void LANGUAGE sql
SET search_path FROM CURRENT AS $$ SELECT pg_notify({channel},
  CASE WHEN octet_length(p_key) <= %PAYLOAD_LIMIT% THEN p_key
  ELSE 'sha256:' || encode(sha256(convert_to(p_key, 'UTF8')), 'hex') END) $$;
"""

PAYLOAD_LIMIT = 1000
"""A NOTIFY payload is the job's key up to this many bytes (UTF-8), else its digest."""


PARTS = [
    part.replace("%PAYLOAD_LIMIT%", str(PAYLOAD_LIMIT))
    for part in (
        DDL,
        slots_sql.TABLES,
        lease_sql.FUNCTIONS,
        queue_sql.FUNCTIONS,
        slots_sql.FUNCTIONS,
    )
]
"""The migration's SQL, run in this order in one transaction: the tables' parts (the first
:data:`TABLE_PARTS`), then the functions' (made again by every upgrade)."""

TABLE_PARTS = 2


def channel_name(schema: str) -> str:
    """The NOTIFY channel of a namespace: ``ail_<schema>``, or a digest of a long schema name
    (a channel name is at most 63 bytes)."""
    name = f"ail_{schema}"
    if len(name.encode()) <= 63:
        return name
    return "ail_" + hashlib.sha256(schema.encode()).hexdigest()[:40]


def notify_payload(key: str) -> str:
    """What ``ail_notify`` sends for ``key`` (the listener files its waiters under it): the
    key itself, or ``sha256:<hex>`` of a key over :data:`PAYLOAD_LIMIT` bytes. A key that
    happens to look like another's digest only wakes that follower early: it reads again."""
    data = key.encode()
    if len(data) <= PAYLOAD_LIMIT:
        return key
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _lock_id(schema: str) -> int:
    """The advisory lock migrations of ``schema`` take (a signed 64-bit number)."""
    return int.from_bytes(
        hashlib.sha256(f"ai_lease:{schema}".encode()).digest()[:8], "big", signed=True
    )


async def installed(conn: psycopg.AsyncConnection[Any], schema: str) -> int | None:
    """The migration version ``schema`` holds (None: no version table there)."""
    # A query of pg_class, not to_regclass(): a name looked up through the backend's catalog
    # cache before another process's migration committed would stay "missing" after it.
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'ail_migrations')",
        (schema,),
    )
    row = await cur.fetchone()
    if row is None or not row[0]:
        return None
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}.ail_migrations")
    cur = await conn.execute(query.format(sql.Identifier(schema)))
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def migrate(conn: psycopg.AsyncConnection[Any], schema: str, where: str) -> bool:
    """Install the schema's tables and functions (migration :data:`VERSION`) unless done;
    True when this call applied it. One transaction: on any error nothing is changed.
    Raises :class:`ConfigError` for a schema that is not ours, or a newer one, or a user
    without the right to create it."""
    async with conn.transaction():
        # DDL, and waiting for another process's migration: not bounded like a lease op.
        await conn.execute("SET LOCAL statement_timeout = '60s'")
        await conn.execute("SET LOCAL lock_timeout = '60s'")
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_id(schema),))
        version = await installed(conn, schema)
        if version is not None and version >= VERSION:
            if version > VERSION:
                raise ConfigError(
                    f"store.url {where!r}: schema {schema!r} is at migration {version}, "
                    f"made by a newer ai_lease (this one knows {VERSION}): upgrade ai_lease"
                )
            return False
        if version is None:
            await _refuse_foreign(conn, schema, where)
        try:
            if version is None or version == 0:
                await _install(conn, schema)
            else:
                await _upgrade(conn, schema, version)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ConfigError(
                f"store.url {where!r}: schema {schema!r} holds no ai_lease tables "
                f"(migration {VERSION} is not applied) and this user may not create them "
                f"({exc.diag.message_primary or exc}): run `ai-lease migrate` as a user who "
                "may, or grant this one CREATE on the database"
            ) from None
    return True


async def _install(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    ident = sql.Identifier(schema)
    await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    await conn.execute(sql.SQL("SET LOCAL search_path = {}, pg_catalog").format(ident))
    await conn.execute(
        "CREATE TABLE ail_migrations (version int PRIMARY KEY, applied_at timestamptz)"
    )
    channel = sql.Literal(channel_name(schema)).as_string(conn)
    for part in PARTS:
        if part.strip():
            await conn.execute(part.replace("{channel}", channel).encode())
    await conn.execute("INSERT INTO ail_migrations VALUES (%s, clock_timestamp())", (VERSION,))


async def _upgrade(conn: psycopg.AsyncConnection[Any], schema: str, version: int) -> None:
    """Take ``schema`` from ``version`` to :data:`VERSION`: each step's table changes, then
    every lease and queue function dropped and made again (their signatures may change)."""
    await conn.execute(
        sql.SQL("SET LOCAL search_path = {}, pg_catalog").format(sql.Identifier(schema))
    )
    for step in range(version + 1, VERSION + 1):
        await conn.execute(UPGRADES[step].encode())
    cur = await conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n"
        " ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname LIKE 'ail\\_%%'"
        " AND p.proname NOT IN ('ail_now', 'ail_notify')",
        (schema,),
    )
    for (name,) in await cur.fetchall():
        await conn.execute(f"DROP FUNCTION {name}".encode())
    channel = sql.Literal(channel_name(schema)).as_string(conn)
    for part in PARTS[TABLE_PARTS:]:
        await conn.execute(part.replace("{channel}", channel).encode())
    await conn.execute("INSERT INTO ail_migrations VALUES (%s, clock_timestamp())", (VERSION,))


async def _refuse_foreign(conn: psycopg.AsyncConnection[Any], schema: str, where: str) -> None:
    """A table or sequence of our names in ``schema`` without our version table is
    somebody else's: refuse it rather than write into it."""
    cur = await conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname LIKE 'ail\\_%%' ORDER BY c.relname LIMIT 1",
        (schema,),
    )
    row = await cur.fetchone()
    if row is not None:
        raise ConfigError(
            f"store.url {where!r}: schema {schema!r} already holds {row[0]!r}, which ai_lease "
            "did not make (no ail_migrations table): nothing was changed; use another "
            "namespace (store.namespace) or move that table away"
        )
