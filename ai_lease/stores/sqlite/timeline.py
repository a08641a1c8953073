"""The SQLite store's job timelines: what each operation notes, in its own transaction.

Each lease operation that changes or refuses a job notes one entry in ``ai_lease_timeline``
(key, seq, at, kind, owner_id, token, stage, detail) inside the transaction that did it; the
last :data:`~ai_lease.lease.timeline.TIMELINE_CAP` entries per key are kept, and the first kept
one's ``seq`` says how many were dropped. The entries say what the Redis scripts say
(stores/redis/scripts.py): the same kinds, the same details, one line of at most 200
characters each. The functions here are pure: a record before, the record after (None: not
written) and the answer give the note. A :data:`~ai_lease.lease.timeline.NOTE_KINDS` entry (a
ladder step, from ``SQLiteStore.note``) keeps up to ``NOTE_LIMIT`` characters of detail.
"""

from __future__ import annotations

import re
import sqlite3

from ai_lease.errors import FencingRejected
from ai_lease.job import JobState
from ai_lease.lease.base import Acquired, Fence, Renewal
from ai_lease.lease.timeline import NOTE_KINDS, NOTE_LIMIT, TIMELINE_CAP, TimelineEntry

__all__ = ["Note", "append", "read"]

Note = tuple[str, str, int, str, str]
"""An entry to write: kind, owner id, token, stage, detail."""

_DETAIL = 200
_LINE_BREAKS = re.compile(r"[\t\r\n]")


def _flat(text: str | None, limit: int = _DETAIL) -> str:
    """A field of an entry: one line, no tabs, bounded (as the scripts write it)."""
    return _LINE_BREAKS.sub(" ", (text or "")[:limit])


def _first_line(text: str | None) -> str:
    return (text or "").split("\n", 1)[0]


def append(
    conn: sqlite3.Connection, key: str, now: float, note: Note | None, last: int | None = None
) -> None:
    """Note one entry for ``key`` (nothing for ``None``), dropping the oldest past the cap.
    ``last``: the timeline's last ``seq``, if this transaction read it already."""
    if note is None:
        return
    kind, owner, token, stage, detail = note
    limit = NOTE_LIMIT if kind in NOTE_KINDS else _DETAIL  # a ladder step says more
    if last is None:
        (last,) = conn.execute(
            "SELECT max(seq) FROM ai_lease_timeline WHERE key = ?", (key,)
        ).fetchone()
    seq = (last or 0) + 1
    conn.execute(
        "INSERT INTO ai_lease_timeline VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (key, seq, now, kind, _flat(owner), token, _flat(stage), _flat(detail, limit)),
    )
    if seq > TIMELINE_CAP:
        conn.execute(
            "DELETE FROM ai_lease_timeline WHERE key = ? AND seq <= ?", (key, seq - TIMELINE_CAP)
        )


def read(
    conn: sqlite3.Connection, key: str, after_seq: int, limit: int
) -> tuple[list[TimelineEntry], int]:
    """Up to ``limit`` entries after ``after_seq``, and how many the cap dropped (none in a
    file opened read-only from before timelines: it has no such table)."""
    try:
        (first,) = conn.execute(
            "SELECT min(seq) FROM ai_lease_timeline WHERE key = ?", (key,)
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return [], 0
        raise
    rows = conn.execute(
        "SELECT seq, at, kind, owner_id, token, stage, detail FROM ai_lease_timeline"
        " WHERE key = ? AND seq > ? ORDER BY seq LIMIT ?",
        (key, after_seq, max(0, min(limit, TIMELINE_CAP))),
    ).fetchall()
    return [TimelineEntry(*row) for row in rows], (first - 1 if first else 0)


# -- what each operation notes --------------------------------------------------------------


def acquired(rec: JobState | None, new: JobState | None, answer: object) -> Note | None:
    """A lease granted (``taken_over`` from another node), or the job given up on."""
    if new is None:
        return None
    if isinstance(answer, Acquired):
        owner = new.owner_id or ""
        if answer.cause and rec is not None:
            why = f"{answer.cause} from {rec.owner_id or ''} token {rec.token}"
            return ("taken_over", owner, new.token, "", why)
        return ("acquired", owner, new.token, "", f"attempt {new.attempts}")
    if rec is None:
        return None
    why = f"gave_up:{rec.attempts}"  # a code: the reader renders it (ai_lease.failure)
    return ("failed", rec.owner_id or "", rec.token, "", why)


def renewed(
    rec: JobState | None, new: JobState | None, answer: Renewal, fence: Fence, stage: str | None
) -> Note | None:
    """A renewal (with the versions progress moved since the last one), or its refusal."""
    if rec is None:
        return None
    if not answer.ok:
        code = answer.reason.value if answer.reason else ""
        return ("renew_refused", fence.owner_id, fence.token, stage or "", code)
    moved = f"progress +{(new or rec).progress_version - rec.progress_version}"
    if answer.stalled:
        moved += ", stalled (alert)"
    return ("renewed", fence.owner_id, fence.token, stage or "", moved)


def released(
    rec: JobState | None,
    done: bool,
    fence: Fence,
    error: str | None,
    snapshot: str | None,
    interrupted: bool,
) -> Note | None:
    if not done or rec is None:
        return None
    why = [
        *(["interrupted"] if interrupted else []),
        *(["snapshot stored"] if snapshot else []),
        *([_first_line(error)] if error else []),
    ]
    return ("released", fence.owner_id, fence.token, rec.stage or "", "; ".join(why))


def finished(new: JobState | None, fence: Fence, reason: str) -> Note | None:
    """A fresh commit (``reason``: the finish reason) or failure (``reason``: why)."""
    if new is None:
        return None
    if new.status.value == "DONE":
        return ("committed", fence.owner_id, fence.token, new.stage or "", reason)
    return ("failed", fence.owner_id, fence.token, new.stage or "", _first_line(reason))


def rejected(rec: JobState | None, exc: FencingRejected) -> Note | None:
    """A fenced write (commit, fail) refused: the presented fence and the refusal's code."""
    if rec is None:
        return None
    held = exc.held
    return ("fenced_write_rejected", held.owner_id, held.token, rec.stage or "", exc.code)


def stalled(done: bool, fence: Fence, stage: str | None, snapshot: str) -> Note | None:
    if not done:
        return None
    why = f"snapshot stored: {_first_line(snapshot)}"
    return ("stalled", fence.owner_id, fence.token, stage or "", why)


def cancelled(rec: JobState | None, new: JobState | None, reason: str) -> Note | None:
    if new is None or rec is None:
        return None
    return ("cancelled", rec.owner_id or "", rec.token, rec.stage or "", reason)
