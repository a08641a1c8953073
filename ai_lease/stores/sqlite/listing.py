"""The SQLite store's job listing (:class:`~ai_lease.lease.base.JobListing`): keyset pages.

A page is one indexed query: ``ORDER BY created_us DESC, key DESC`` on the index
``(created_us, key)`` (``(status, created_us, key)`` with a status), continued from the
cursor's ``(created_us, key)`` by a row-value comparison — never ``OFFSET``, so a deep page
costs what the first does. A key prefix is a range on ``key`` (``prefix <= key < end``),
never ``LIKE``: ``%`` and ``_`` in it are plain characters. Counts are one ``GROUP BY
status`` over the status index. A file opened read-only that predates the ``created_us``
column (it cannot be migrated) is still listed, by reading each record's creation time:
a full scan per page there. A page's keys are found on an index first and only its own
records read. A prefix with few keys (up to :data:`PREFIX_SORT_MAX`, a bounded count on the
key index) sorts its key range; one with more walks the creation index, skipping other keys.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink
from ai_lease.job import JobState
from ai_lease.lease.base import JobPage
from ai_lease.lease.listing import (
    check_limit,
    check_status,
    decode_cursor,
    encode_cursor,
    no_key_starts,
    prefix_end,
    report_corrupt,
)
from ai_lease.stores.sqlite.file import SQLiteFile
from ai_lease.stores.sqlite.migrate import CREATED_FROM_RECORD

__all__ = ["SQLiteListing"]

_Row = tuple[str, int, JobState | CorruptRecord]

PREFIX_SORT_MAX = 2000
"""Up to this many keys with a prefix, a page sorts the prefix's key range; beyond, it walks
the creation index newest first, skipping other keys (the matches are then dense enough)."""


class SQLiteListing:
    """``list_page`` and ``count_jobs`` on the store's file."""

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file

    async def list_page(
        self,
        *,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        on_corrupt: CorruptSink | None = None,
    ) -> JobPage:
        """A page of jobs, newest first (:class:`~ai_lease.lease.base.JobListing`)."""
        check_limit(limit)
        status = check_status(status)
        cursor = None if after is None else decode_cursor(after)
        if no_key_starts(prefix):
            return JobPage([], None)

        def work(conn: sqlite3.Connection) -> list[_Row]:
            created = _created(conn)
            walk = bool(prefix) and created == "created_us" and _many_match(conn, prefix or "")
            sql, args = _page_query(created, status, prefix, cursor, walk_index=walk)
            now = self._file._clock()
            rows = conn.execute(sql, [*args, limit + 1]).fetchall()
            rows.sort(key=lambda row: (row[1], row[0]), reverse=True)  # Python's str order
            # is code-point order, as SQLite's BINARY is on UTF-8
            return [(key, at, self._decode_or_corrupt(key, blob, now)) for key, at, blob in rows]

        rows = await self._file._run("list_page", work)
        more = len(rows) > limit
        rows = rows[:limit]
        jobs = []
        for _, _, job in rows:
            if isinstance(job, CorruptRecord):
                report_corrupt(job, on_corrupt)
            else:
                jobs.append(job)
        last = rows[-1] if more else None
        return JobPage(jobs, None if last is None else encode_cursor(last[1], last[0]))

    async def count_jobs(self) -> dict[str, int]:
        """Jobs per status: one ``GROUP BY`` on the status index."""
        rows = await self._file._run(
            "count_jobs",
            lambda conn: conn.execute(
                "SELECT status, count(*) FROM ai_lease_jobs GROUP BY status"
            ).fetchall(),
        )
        return {status: count for status, count in rows if count}

    def _decode_or_corrupt(self, key: str, blob: bytes, now: float) -> JobState | CorruptRecord:
        try:
            return self._file._decode(key, blob, now)
        except CorruptRecord as exc:  # reported on the event loop's side
            return exc


def _created(conn: sqlite3.Connection) -> str:
    """The creation-time column, or (a read-only file from before it) its expression."""
    columns = conn.execute("PRAGMA table_info(ai_lease_jobs)").fetchall()
    return "created_us" if any(c[1] == "created_us" for c in columns) else CREATED_FROM_RECORD


def _key_range(prefix: str) -> tuple[str, list[Any]]:
    """``prefix <= key < prefix_end(prefix)``: the keys starting with ``prefix``, literally."""
    end = prefix_end(prefix)
    if end is None:
        return "key >= ?", [prefix]
    return "key >= ? AND key < ?", [prefix, end]


def _many_match(conn: sqlite3.Connection, prefix: str) -> bool:
    """Whether more than :data:`PREFIX_SORT_MAX` keys start with ``prefix`` (a bounded count
    on the key index)."""
    where, args = _key_range(prefix)
    sql = f"SELECT count(*) FROM (SELECT 1 FROM ai_lease_jobs WHERE {where} LIMIT ?)"
    return bool(conn.execute(sql, [*args, PREFIX_SORT_MAX + 1]).fetchone()[0] > PREFIX_SORT_MAX)


def _page_query(
    created: str,
    status: str | None,
    prefix: str | None,
    cursor: tuple[int, str] | None,
    *,
    walk_index: bool = False,
) -> tuple[str, list[Any]]:
    """One page's SELECT (its LIMIT left as the last parameter) and its parameters: the
    page's keys from an index first, then their records (in no order: the caller sorts the
    page's few rows). ``walk_index`` reads a prefix's
    keys off the creation index (many match) instead of sorting its key range (few do)."""
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if prefix:
        clause, bounds = _key_range(prefix)
        where.append(clause)
        args += bounds
    if cursor is not None:
        where.append(f"({created}, key) < (?, ?)")
        args += list(cursor)
    index = ""
    if walk_index and created == "created_us":
        by = "ai_lease_jobs_by_status_created" if status is not None else "ai_lease_jobs_by_created"
        index = f" INDEXED BY {by}"
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = (
        f"SELECT j.key, p.at, j.record FROM (SELECT key, {created} AS at FROM ai_lease_jobs"
        f"{index} {clause} ORDER BY at DESC, key DESC LIMIT ?) AS p"
        " JOIN ai_lease_jobs AS j ON j.key = p.key"
    )
    return sql, args
