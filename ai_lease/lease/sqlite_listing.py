"""The SQLite store's job listing (:class:`~ai_lease.lease.base.JobListing`): keyset pages.

A page is one indexed query: ``ORDER BY created_us DESC, key DESC`` on the index
``(created_us, key)`` (``(status, created_us, key)`` with a status), continued from the
cursor's ``(created_us, key)`` by a row-value comparison — never ``OFFSET``, so a deep page
costs what the first does. A key prefix is a range on ``key`` (``prefix <= key < end``),
never ``LIKE``: ``%`` and ``_`` in it are plain characters. Counts are one ``GROUP BY
status`` over the status index. A file opened read-only that predates the ``created_us``
column (it cannot be migrated) is still listed, by reading each record's creation time:
a full scan per page there.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink
from ai_lease.job import JobState
from ai_lease.lease.base import JobPage
from ai_lease.lease.listing import (
    check_limit,
    decode_cursor,
    encode_cursor,
    prefix_end,
    report_corrupt,
)
from ai_lease.lease.sqlite_file import CREATED_FROM_RECORD, SQLiteFile

__all__ = ["SQLiteListing"]

_Row = tuple[str, int, JobState | CorruptRecord]


class SQLiteListing(SQLiteFile):
    """``list_page`` and ``count_jobs`` on the store's file."""

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
        cursor = None if after is None else decode_cursor(after)

        def work(conn: sqlite3.Connection) -> list[_Row]:
            created = _created(conn)
            sql, args = _page_query(created, status, prefix, cursor)
            now = self._clock()
            return [
                (key, at, self._decode_or_corrupt(key, blob, now))
                for key, at, blob in conn.execute(sql, [*args, limit + 1]).fetchall()
            ]

        rows = await self._run("list_page", work)
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
        rows = await self._run(
            "count_jobs",
            lambda conn: conn.execute(
                "SELECT status, count(*) FROM ai_lease_jobs GROUP BY status"
            ).fetchall(),
        )
        return {status: count for status, count in rows if count}

    def _decode_or_corrupt(self, key: str, blob: bytes, now: float) -> JobState | CorruptRecord:
        try:
            return self._decode(key, blob, now)
        except CorruptRecord as exc:  # reported on the event loop's side
            return exc


def _created(conn: sqlite3.Connection) -> str:
    """The creation-time column, or (a read-only file from before it) its expression."""
    columns = conn.execute("PRAGMA table_info(ai_lease_jobs)").fetchall()
    return "created_us" if any(c[1] == "created_us" for c in columns) else CREATED_FROM_RECORD


def _page_query(
    created: str, status: str | None, prefix: str | None, cursor: tuple[int, str] | None
) -> tuple[str, list[Any]]:
    """One page's SELECT (its LIMIT left as the last parameter) and its parameters."""
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if prefix:
        where.append("key >= ?")
        args.append(prefix)
        if (end := prefix_end(prefix)) is not None:
            where.append("key < ?")
            args.append(end)
    if cursor is not None:
        where.append(f"({created}, key) < (?, ?)")
        args += list(cursor)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = (
        f"SELECT key, {created}, record FROM ai_lease_jobs {clause}"
        f" ORDER BY {created} DESC, key DESC LIMIT ?"
    )
    return sql, args
