"""The SQLite store's timeline part: reading a job's timeline and adding a note to it.

What each lease operation notes is decided in :mod:`ai_lease.stores.sqlite.timeline`, inside
that operation's transaction; this part only reads the timeline back and writes the notes a
runner adds (:class:`~ai_lease.lease.timeline.JobNotes`).
"""

from __future__ import annotations

import sqlite3

from ai_lease.lease.storable import diagnostic
from ai_lease.lease.timeline import TIMELINE_CAP, TimelineEntry, check_note
from ai_lease.stores.sqlite import timeline
from ai_lease.stores.sqlite.file import SQLiteFile

__all__ = ["SQLiteTimeline"]


class SQLiteTimeline:
    """The :class:`~ai_lease.lease.timeline.JobTimeline` and ``JobNotes`` part."""

    def __init__(self, file: SQLiteFile) -> None:
        self._file = file

    async def timeline(
        self, key: str, *, after_seq: int = 0, limit: int = TIMELINE_CAP
    ) -> tuple[list[TimelineEntry], int]:
        """The job's timeline after ``after_seq`` (see :class:`.JobTimeline`)."""
        return await self._file._run(
            "timeline", lambda conn: timeline.read(conn, key, after_seq, limit)
        )

    async def note(
        self,
        key: str,
        kind: str,
        detail: str,
        *,
        owner_id: str,
        token: int,
        stage: str | None = None,
    ) -> bool:
        """One entry in an existing job's timeline (:class:`~ai_lease.lease.timeline.JobNotes`)."""
        detail = check_note(kind, detail)
        owner_id, stage = diagnostic(owner_id) or "", diagnostic(stage)

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(  # whether the job exists, and its timeline's last seq
                "SELECT (SELECT max(seq) FROM ai_lease_timeline WHERE key = ?1)"
                " FROM ai_lease_jobs WHERE key = ?1",
                (key,),
            ).fetchone()
            if row is None:
                return False
            entry = (kind, owner_id, token, stage or "", detail)
            timeline.append(conn, key, self._file._clock(), entry, row[0] or 0)
            return True

        return await self._file._write("note", work)
