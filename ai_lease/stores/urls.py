"""Store URLs: open a store from one (a URL without its password is
:func:`ai_lease.redaction.mask_url`)."""

from __future__ import annotations

import re

from ai_lease.errors import ConfigError
from ai_lease.lease.base import LeaseStore
from ai_lease.redaction import mask_url

__all__ = ["SCHEMES", "open_store"]

SCHEMES = (
    *("sqlite", "redis", "rediss", "unix", "redis+cluster", "rediss+cluster"),
    *("postgresql", "postgres"),
)


def sqlite_path(url: str) -> str:
    """``sqlite:///rel/path.db`` -> ``rel/path.db``; ``sqlite:////abs.db`` -> ``/abs.db``."""
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or path == "/":
        raise ConfigError(f"store.url {url!r}: use sqlite:///relative/path.db or sqlite:////abs.db")
    return path[1:]


def check_redis_db(url: str) -> None:
    """A Redis URL's database must be a number (``redis://host:6379/2``, ``?db=2`` for
    ``unix://``), 0 on Cluster: redis-py would silently use database 0 for ``/abc``."""
    scheme, _, rest = url.partition("://")
    rest, _, query = rest.partition("?")
    path = "" if scheme == "unix" else rest.rpartition("@")[2].partition("/")[2]
    dbs = [path.rstrip("/")] if path.strip("/") else []
    dbs += re.findall(r"(?:^|&)db=([^&#]*)", query)
    for db in dbs:
        if not db.isdigit():
            raise ConfigError(
                f"store.url {mask_url(url)!r}: the database {db!r} is not a number; "
                "name it by number (redis://host:6379/N, or ?db=N for unix://; 0 by default)"
            )
        if "cluster" in scheme and int(db) != 0:
            raise ConfigError(
                f"store.url {mask_url(url)!r}: Redis Cluster has only database 0, not {db}"
            )


def open_store(
    url: str,
    *,
    namespace: str = "ai_lease",
    op_timeout: float = 2.0,
    poll_interval: float = 0.05,
    create: bool = True,
) -> LeaseStore:
    """Open the store a URL names: ``sqlite:///…`` (embedded), ``redis://``, ``rediss://``,
    ``unix://`` (Redis), ``redis+cluster://`` / ``rediss+cluster://`` (Redis Cluster, any
    node as the seed), ``postgresql://`` / ``postgres://`` (PostgreSQL: libpq's URL, so
    ``?sslmode=`` and its environment variables apply; needs ``ai_lease[postgres]``).
    Opening does no I/O; the first operation connects, and creates the store (the SQLite
    file, the PostgreSQL schema, Redis' marker keys) if it is not there yet. With
    ``create=False`` (a look: status, ls, the dashboard) nothing is ever created: an
    operation on a store that does not exist raises :class:`~ai_lease.errors.StoreMissing`
    (SQLite, PostgreSQL; on Redis an empty namespace is an empty store)."""
    if not isinstance(url, str):
        raise TypeError(
            f"open_store(): the URL is {'None' if url is None else f'a {type(url).__name__}'}: "
            "pass a store URL (sqlite:///jobs.db, redis://…, postgresql://…)"
        )
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme == "sqlite":
        from ai_lease.stores.sqlite.store import SQLiteStore

        path = sqlite_path(url)
        return SQLiteStore(path, op_timeout=op_timeout, poll_interval=poll_interval, create=create)
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        from ai_lease.stores.redis.store import RedisStore

        check_redis_db(url)
        return RedisStore.from_url(url, namespace=namespace, op_timeout=op_timeout, create=create)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url, namespace, op_timeout, poll_interval, create)
    raise ConfigError(
        f"store.url {mask_url(url)!r}: unknown scheme {scheme or '(none)'!r}; "
        f"use one of {', '.join(s + '://' for s in SCHEMES)}"
    )


def _postgres(
    url: str, namespace: str, op_timeout: float, poll_interval: float, create: bool
) -> LeaseStore:
    """The PostgreSQL store (the optional extra: a clear error when psycopg is missing)."""
    try:
        from ai_lease.stores.postgres.store import PostgresStore
    except ImportError as exc:
        raise ConfigError(
            f"store.url {mask_url(url)!r}: the PostgreSQL store needs psycopg ({exc.name} is "
            "not installed): pip install 'ai_lease[postgres]'"
        ) from None
    store: LeaseStore = PostgresStore.from_url(
        url, namespace=namespace, op_timeout=op_timeout, poll_interval=poll_interval, create=create
    )
    return store
