"""The PostgreSQL store's timeline part: a job's timeline read back, and the notes a runner
adds.

What each lease operation notes is written by that operation's function, in the same
transaction (stores/postgres/lease_sql.py); this part reads the timeline back (one
statement) and adds notes (:class:`~ai_lease.lease.timeline.JobNotes`).
"""

from __future__ import annotations

from ai_lease.lease import timeline
from ai_lease.lease.storable import diagnostic
from ai_lease.lease.timeline import TIMELINE_CAP, TimelineEntry
from ai_lease.stores.postgres.conn import PostgresConn, job_key

__all__ = ["PostgresTimeline"]

_TIMELINE = (
    "SELECT (SELECT min(seq) - 1 FROM {schema}.ail_timeline WHERE key = %s),"
    " t.seq, t.at, t.kind, t.owner_id, t.token, t.stage, t.detail"
    " FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT * FROM {schema}.ail_timeline x"
    " WHERE x.key = %s AND x.seq > %s ORDER BY x.seq LIMIT %s) t ON true ORDER BY t.seq"
)
_NOTE = "SELECT {schema}.ail_note_job(%s, %s, %s, %s, %s, %s, %s)"


class PostgresTimeline:
    """The :class:`~ai_lease.lease.timeline.JobTimeline` and ``JobNotes`` part."""

    def __init__(self, conn: PostgresConn) -> None:
        self._conn = conn

    async def timeline(
        self, key: str, *, after_seq: int = 0, limit: int = TIMELINE_CAP
    ) -> tuple[list[TimelineEntry], int]:
        """The job's timeline after ``after_seq`` (:class:`~ai_lease.lease.timeline.JobTimeline`):
        one statement, and how many entries the cap dropped."""
        key, bounded = job_key(key), max(0, min(limit, TIMELINE_CAP))
        rows = await self._conn._fetch("timeline", _TIMELINE, (key, key, after_seq, bounded))
        dropped = int(rows[0][0] or 0) if rows else 0
        entries = [TimelineEntry(*row[1:]) for row in rows if row[1] is not None]
        return entries, dropped

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
        """Append one entry to the job's timeline (the termination ladder's steps): not
        fenced, written only for an existing job (False for an unknown key)."""
        detail = timeline.check_note(kind, detail)
        owner_id, stage = diagnostic(owner_id) or "", diagnostic(stage)
        args = (job_key(key), kind, detail, owner_id, token, stage, timeline.NOTE_LIMIT)
        row = await self._conn._fetchone("note", _NOTE, args, resend=False)  # twice: two entries
        return bool(row and row[0])
