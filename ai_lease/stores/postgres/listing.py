"""The PostgreSQL store's job listing (:class:`~ai_lease.lease.base.JobListing`): keyset pages.

A page is one indexed query: ``ORDER BY created_at DESC, key DESC`` on the index
``ail_jobs_by_created`` (``ail_jobs_by_status_created`` with a status), continued from the
cursor's ``(created_at, key)`` by a row-value comparison — never ``OFFSET``, so a deep page
costs what the first does. Keys compare in the ``"C"`` collation (byte order, which for
UTF-8 is code-point order, as the other stores compare them), whatever the database's
default. A key prefix is a range on ``key`` (``prefix <= key < end``), never ``LIKE``: ``%``
and ``_`` in it are plain characters. A page leaves out the big fields (``spec``,
``result``, ``stall_snapshot``, ``checkpoint``), as the Redis store's do. Counts are one
``GROUP BY status``.

The store's clock has microsecond steps (``clock_timestamp()``), so a cursor's
``created_us`` over 10**6 is exactly the ``created_at`` it came from.
"""

from __future__ import annotations

from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink, skip_corrupt
from ai_lease.job import JobState
from ai_lease.lease.base import JobPage
from ai_lease.lease.listing import (
    check_limit,
    check_status,
    created_us,
    decode_cursor,
    encode_cursor,
    no_key_starts,
    prefix_end,
    report_corrupt,
)
from ai_lease.stores.postgres.conn import PostgresConn
from ai_lease.stores.postgres.schema import JOB_COLUMNS

__all__ = ["PostgresListing"]

_BIG = frozenset({"spec", "result", "stall_snapshot", "checkpoint"})
_LEAN = ", ".join(f"NULL AS {c}" if c in _BIG else c for c in JOB_COLUMNS)
_ALL = ", ".join(JOB_COLUMNS)
_KEY, _CREATED = JOB_COLUMNS.index("key"), JOB_COLUMNS.index("created_at")
_NOW = "extract(epoch FROM clock_timestamp())::double precision"
_ORDER = 'ORDER BY created_at DESC, key COLLATE "C" DESC'


class PostgresListing:
    """``list_jobs``, ``list_page`` and ``count_jobs`` on the jobs table's indexes."""

    def __init__(self, conn: PostgresConn) -> None:
        self._conn = conn

    async def list_jobs(
        self, *, status: str | None = None, limit: int = 100, on_corrupt: CorruptSink | None = None
    ) -> list[JobState]:
        """Up to ``limit`` whole records, newest first (a corrupt one raises, or with
        ``on_corrupt`` is skipped)."""
        where, args = ("WHERE status = %s", [status]) if status else ("", [])
        rows = await self._conn._fetch(
            "list_jobs",
            f"SELECT {_NOW}, {_ALL} FROM {{schema}}.ail_jobs {where} {_ORDER} LIMIT %s",
            [*args, limit],
        )
        jobs = []
        for row in rows:
            try:
                jobs.append(self._conn._job(row[1:], row[0]))
            except CorruptRecord as exc:
                skip_corrupt(exc, on_corrupt)
        return jobs

    async def list_page(
        self,
        *,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        on_corrupt: CorruptSink | None = None,
    ) -> JobPage:
        """A page of jobs, newest first (:class:`~ai_lease.lease.base.JobListing`): one
        query, ``limit + 1`` rows read at most."""
        check_limit(limit)
        status = check_status(status)
        cursor = None if after is None else decode_cursor(after)
        if no_key_starts(prefix):
            return JobPage([], None)
        sql, args = _page_query(status, prefix, cursor)
        rows = await self._conn._fetch("list_page", sql, [*args, limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        jobs = []
        for row in rows:
            try:
                jobs.append(self._conn._job(row[1:], row[0]))
            except CorruptRecord as exc:
                report_corrupt(exc, on_corrupt)
        if not more:
            return JobPage(jobs, None)
        last = rows[-1][1:]
        return JobPage(jobs, encode_cursor(created_us(last[_CREATED]), last[_KEY]))

    async def count_jobs(self) -> dict[str, int]:
        """Jobs per status: one ``GROUP BY`` on the status index."""
        rows = await self._conn._fetch(
            "count_jobs", "SELECT status, count(*) FROM {schema}.ail_jobs GROUP BY status"
        )
        return {str(status): int(n) for status, n in rows if n}


def _page_query(
    status: str | None, prefix: str | None, cursor: tuple[int, str] | None
) -> tuple[str, list[Any]]:
    """One page's SELECT (its LIMIT left as the last parameter) and its parameters."""
    where: list[str] = []
    args: list[Any] = []
    if status is not None:
        where.append("status = %s")
        args.append(status)
    if prefix:
        where.append('key COLLATE "C" >= %s')
        args.append(prefix)
        end = prefix_end(prefix)
        if end is not None:
            where.append('key COLLATE "C" < %s')
            args.append(end)
    if cursor is not None:
        where.append('(created_at, key COLLATE "C") < (%s, %s)')
        args += [cursor[0] / 1_000_000, cursor[1]]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT {_NOW}, {_LEAN} FROM {{schema}}.ail_jobs {clause} {_ORDER} LIMIT %s"
    return sql, args
