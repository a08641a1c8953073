"""What both stores' job listings share: the page cursor, the limit and the key-prefix range.

A cursor is opaque text: URL-safe base64 of ``"<created_us>:<job key>"``, the position of
the last job a page held (pages are newest first: ``created_at`` descending, then key).
Anything else passed back as a cursor is a :class:`ValueError` saying so, never a query.
A key prefix no job key can start (a NUL in it, say: :func:`no_key_starts`) selects an
empty page without a query, on every store alike.

>>> decode_cursor(encode_cursor(1_764_600_000_123_456, "job-1"))
(1764600000123456, 'job-1')
"""

from __future__ import annotations

import base64
import binascii
import logging

from ai_lease.errors import CorruptRecord, CorruptSink, JobSpecError
from ai_lease.job import Status, validate_key
from ai_lease.lease.storable import key_can_start

__all__ = [
    "MAX_LIMIT",
    "check_limit",
    "check_status",
    "created_us",
    "decode_cursor",
    "encode_cursor",
    "no_key_starts",
    "prefix_end",
    "report_corrupt",
]

log = logging.getLogger("ai_lease.store")

MAX_LIMIT = 500
"""The most jobs one page holds."""

_MAX_CURSOR_CHARS = 64 * 1024
_MAX_US_DIGITS = 19  # a creation time in us: 16 digits until the year 2286


def created_us(seconds: float) -> int:
    """A creation time as both stores order by it: whole microseconds."""
    return round(seconds * 1_000_000)


def check_limit(limit: int) -> int:
    """``limit`` itself, or a ValueError unless it is an int in 1..:data:`MAX_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit!r}")
    return limit


def check_status(status: str | None) -> str | None:
    """The status to filter by (None, or ``""``: any), or a ValueError naming the statuses."""
    if status is None or status == "":
        return None
    if status not in Status.__members__:
        names = ", ".join(Status.__members__)
        raise ValueError(f"status must be one of {names} (or none for any), not {status!r:.40}")
    return status


def encode_cursor(at_us: int, key: str) -> str:
    """The cursor of a page that ended at the job ``key`` created at ``at_us``."""
    raw = f"{at_us}:{key}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """``(created_us, key)`` of a cursor this module made; anything else is a ValueError."""
    if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_CURSOR_CHARS:
        raise _bad(cursor)
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        at, sep, key = raw.decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise _bad(cursor) from None
    if not sep or not at.isascii() or not at.isdigit() or len(at) > _MAX_US_DIGITS:
        raise _bad(cursor)
    try:
        return int(at), validate_key(key)  # a key no job has (a NUL): not a page's cursor
    except JobSpecError:
        raise _bad(cursor) from None


def no_key_starts(prefix: str | None) -> bool:
    """Whether ``prefix`` filters and no job key can start with it (a NUL, a control
    character, a lone surrogate, over 512 characters): its page is empty, asked of no store."""
    return bool(prefix) and not key_can_start(prefix or "")


def _bad(cursor: object) -> ValueError:
    shown = repr(cursor)[:40]
    return ValueError(
        f"cursor {shown} is not one a job page gave: pass a page's next_cursor as it is,"
        " or no cursor for the first page"
    )


def prefix_end(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (None: there is none),
    so that ``prefix <= key < prefix_end(prefix)`` selects exactly the keys it starts —
    literally: ``%``, ``_``, ``*`` and ``[`` are characters like any other. UTF-8's byte
    order is code-point order, so this holds for SQLite's BINARY collation too.

    >>> prefix_end("job-")
    'job.'
    """
    chars = list(prefix)
    while chars:
        point = ord(chars.pop()) + 1
        if 0xD800 <= point <= 0xDFFF:  # surrogates are not characters: skip past them
            point = 0xE000
        if point <= 0x10FFFF:
            return "".join(chars) + chr(point)
    return None


def report_corrupt(exc: CorruptRecord, on_corrupt: CorruptSink | None) -> None:
    """A corrupt record in a page: to the caller's sink, else to the log; the page goes on."""
    if on_corrupt is not None:
        on_corrupt(exc)
    else:
        log.warning("job page: skipped %s", exc)
