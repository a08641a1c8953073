"""The Redis store's timeline part: a job's timeline read back, and the notes a runner adds.

What each lease operation notes is written by that operation's script, in the same round
trip (stores/redis/scripts.py); this part reads the list back (one LRANGE) and adds notes
(:class:`~ai_lease.lease.timeline.JobNotes`).
"""

from __future__ import annotations

from ai_lease.errors import CorruptRecord
from ai_lease.lease.storable import diagnostic
from ai_lease.lease.timeline import TIMELINE_CAP, TimelineEntry, check_note
from ai_lease.stores.redis.calls import RedisCalls
from ai_lease.stores.redis.keys import timeline_entry

__all__ = ["RedisTimeline"]


class RedisTimeline:
    """The :class:`~ai_lease.lease.timeline.JobTimeline` and ``JobNotes`` part."""

    def __init__(self, calls: RedisCalls) -> None:
        self._calls = calls

    async def timeline(
        self, key: str, *, after_seq: int = 0, limit: int = TIMELINE_CAP
    ) -> tuple[list[TimelineEntry], int]:
        """The job's timeline after ``after_seq`` (:class:`~ai_lease.lease.timeline.JobTimeline`):
        one LRANGE of at most ``TIMELINE_CAP`` entries."""
        raw = await self._calls._cmd("timeline", "LRANGE", self._calls.keys(key)[2], 0, -1)
        try:
            entries = [timeline_entry(line) for line in raw]
        except ValueError:
            raise CorruptRecord(key, "a timeline entry is not ours", kind="timeline") from None
        dropped = entries[0].seq - 1 if entries else 0
        return [e for e in entries if e.seq > after_seq][: max(0, limit)], dropped

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
        args = [kind, diagnostic(owner_id) or "", token, diagnostic(stage) or "", detail]
        return bool(await self._calls._call("note", key, "NOTE", args))
