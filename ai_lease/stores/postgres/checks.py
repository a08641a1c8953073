"""What the PostgreSQL store checks before any I/O, so that a bad input is a typed error
naming the problem rather than a refusal from deep inside libpq or the server: the URL (a
message that never quotes libpq's, which may hold the password), the namespace (a
PostgreSQL name has at most 63 bytes), job keys (:func:`ai_lease.job.validate_key`), and
the bounds every connection carries in its startup options.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ai_lease.errors import ConfigError, JobSpecError
from ai_lease.job import validate_key
from ai_lease.redaction import mask_url

__all__ = ["NAME_LIMIT", "check_namespace", "check_url", "job_key", "with_bounds"]

NAME_LIMIT = 63
"""The most bytes of a PostgreSQL name (NAMEDATALEN - 1): a longer namespace is refused."""


def check_namespace(namespace: str) -> None:
    """A :class:`ConfigError` for a namespace PostgreSQL would cut short, silently: two
    namespaces would share one schema while their NOTIFY channels differ."""
    size = len(namespace.encode())
    if size > NAME_LIMIT:
        raise ConfigError(
            f"store.namespace {namespace[:80]!r}: {size} bytes is longer than a PostgreSQL "
            f"schema name may be ({NAME_LIMIT} bytes): use a shorter one"
        )


def check_url(url: str) -> None:
    """Raise :class:`ConfigError` for a URL libpq would refuse (before any I/O)."""
    where = mask_url(url)
    params = _parsed(url, where)
    port = str(params.get("port") or "")
    if port and not all(part.isdigit() for part in port.split(",")):
        raise ConfigError(f"store.url {where!r}: the port {port!r} is not a number")
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        raise ConfigError(
            f"store.url {where!r}: sslmode {sslmode!r} is not one of {', '.join(_SSLMODES)}"
        )


def _parsed(conninfo: str, where: str) -> dict[str, Any]:
    """libpq's reading of ``conninfo``, or a :class:`ConfigError` in a fixed text: libpq's
    own parse message quotes the bad token, which may be the password. Raised outside the
    ``except`` so that no cause or context carries that message into a log."""
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        pass
    raise ConfigError(
        f"store.url {where!r}: the URL does not parse: check its percent-encoding and its options"
    )


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def with_bounds(conninfo: str, op_timeout: float, where: str) -> str:
    """The conninfo with the server-side bounds added to its ``options`` (kept from the URL
    too), and an application name unless it names one."""
    params = _parsed(conninfo, where)
    # A little under op_timeout: the server ends a stalled statement first (a clean "rolled
    # back" answer, the connection kept); the client's deadline backs it up.
    ms = max(1, round(op_timeout * 900))
    bounds = (
        f"-c statement_timeout={ms} -c lock_timeout={ms} "
        f"-c idle_in_transaction_session_timeout={max(ms * 5, 10_000)}"
    )
    options = " ".join(part for part in (str(params.get("options") or ""), bounds) if part)
    extra: dict[str, Any] = {"options": options}
    if "application_name" not in params:
        extra["application_name"] = "ai_lease"
    if "connect_timeout" not in params:
        extra["connect_timeout"] = max(2, round(op_timeout * 2))
    if "keepalives" not in params:  # a vanished peer noticed in ~25 s, not the kernel's hours
        extra.update(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
    return make_conninfo(conninfo, **extra)


def job_key(key: str) -> str:
    """``key`` if it can name a job (:func:`ai_lease.job.validate_key`: 1 to 512 printable
    characters), else :class:`JobSpecError` before any I/O. Every operation that takes a key
    checks it: a longer one would pass an insert and then fail where PostgreSQL has limits
    (a btree entry of at most 2704 bytes; NOTIFY's 8000-byte payload)."""
    try:
        return validate_key(key)
    except JobSpecError:
        if not isinstance(key, str) or len(key) <= 80:
            raise
    raise JobSpecError(
        f"job key {key[:40]!r}... ({len(key)} characters) is invalid: use 1 to 512 "
        "characters with no control characters (no NUL) and no lone surrogates"
    )
