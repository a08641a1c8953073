"""The Redis store's job listing (:class:`~ai_lease.lease.base.JobListing`): pages off the
creation index, counts off the counters the job scripts keep.

**Index.** ``{<ns>:queue}:created`` is a sorted set of job hash -> ``created_at`` (us), in
the namespace's own hash tag like its queue and lease index; the scripts that create a job
(``ACQUIRE`` of a new key, ``SUBMIT``), re-date it (``RETRY``) or delete it (``REMOVE``,
``PRUNE``) keep it (and the name index) in the same script as the record, and the scripts
that move a job's status keep ``{<ns>:queue}:counts`` (a sorted set: status -> jobs, by
ZINCRBY). PENDING is not counted: it is the index's size less every other count, so that a
new job and its first acquire move no counter. ``count_jobs`` is one ZCARD and one ZRANGE of
a few members.

**Bounds.** One page is one ``LIST_PAGE`` script: ZREVRANGEBYSCORE from the cursor in chunks
of :data:`~ai_lease.stores.redis.listing_scripts.LIST_CHUNK`, reading at most
:data:`LIST_BOUND` index entries (or ``limit + 1`` if more): unfiltered that is
``limit + 1`` entries, O(log n + limit); with a status filter it stops after ``limit``
matches or the bound, whichever comes first, and returns a cursor to go on from (a page may
then hold fewer than ``limit`` jobs and still have a next one). A key prefix that at most
:data:`LIST_BOUND` jobs share is read off the name index ``{<ns>:queue}:names`` (the job
hashes at score 0: ZLEXCOUNT, then ZRANGEBYLEX of that range, sorted by creation), however
deep its jobs are; a prefix more jobs share walks the creation index like a status does.

**Jobs from before the index.** The first listing call of a process checks a marker key
(``{<ns>:queue}:created_ready``); when it is missing, it SCANs the namespace's job hashes once
(``COUNT`` 500 per step, each step bounded by ``op_timeout``), indexing and counting each job
not yet indexed (``BACKFILL``, idempotent, safe beside running scripts), then sets the
marker. To index again (say, after processes of an older ai-lease created jobs beside newer
ones), delete the marker key: the next listing backfills again.

**Cluster.** A script may touch one slot only, and a job's keys are in its own slot, not the
namespace's, so the scripts cannot keep the index (nor the counts) atomically with the record
on Cluster: there ``list_page`` and ``count_jobs`` fall back to a SCAN of the namespace,
O(jobs) per call (the dashboard on Cluster is for small stores).
"""

from __future__ import annotations

from typing import Any

from ai_lease.errors import CorruptRecord, CorruptSink
from ai_lease.job import JobState, Status
from ai_lease.lease.base import JobPage
from ai_lease.lease.listing import (
    check_limit,
    check_status,
    created_us,
    decode_cursor,
    encode_cursor,
    no_key_starts,
    report_corrupt,
)
from ai_lease.stores.redis.calls import RedisCalls
from ai_lease.stores.redis.keys import decode, hash_tag

__all__ = ["LIST_BOUND", "RedisListing"]

LIST_BOUND = 2000
"""Index entries one filtered page reads at most (one LIST_PAGE script)."""

_BACKFILL_BATCH = 500


class RedisListing:
    """``list_page`` and ``count_jobs`` on the namespace's creation index."""

    def __init__(self, calls: RedisCalls) -> None:
        self._calls = calls
        self._index_ready = False

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
        script, bounded (see the module docstring)."""
        check_limit(limit)
        status = check_status(status)
        cursor = None if after is None else decode_cursor(after)
        if no_key_starts(prefix):
            return JobPage([], None)
        if self._calls._cluster:
            return await self._scanned_page(status, prefix, cursor, limit, on_corrupt)
        await self._ensure_index()
        at, name = ("", "") if cursor is None else (str(cursor[0]), self._calls.keys(cursor[1])[0])
        pre = "" if not prefix else f"{self._calls._ns}:{{{hash_tag(prefix)}"
        bound = max(LIST_BOUND, limit + 1)
        args = [at, name, limit, status or "", pre, bound]
        keys = [self._calls._created, self._calls._names]
        reply = await self._calls._eval("list_page", "LIST_PAGE", keys, args)
        jobs = []
        for member, fields in zip(reply[3::2], reply[4::2], strict=True):
            job = self._page_job(member, fields, reply[0])
            if isinstance(job, CorruptRecord):
                report_corrupt(job, on_corrupt)
            else:
                jobs.append(job)
        if not reply[2]:
            return JobPage(jobs, None)
        return JobPage(jobs, encode_cursor(int(float(reply[1])), self._calls._key_of(reply[2])))

    def _page_job(self, member: str, fields: Any, now_us: Any) -> JobState | CorruptRecord:
        key = self._calls._key_of(member)
        if fields == "corrupt":
            return CorruptRecord(key, "record has no ai_lease schema marker")
        try:
            return decode(key, fields, now_us)
        except CorruptRecord as exc:
            return exc

    async def count_jobs(self) -> dict[str, int]:
        """Jobs per status: one ZRANGE of the counts the job scripts keep."""
        if self._calls._cluster:
            return await self._scanned_counts()
        await self._ensure_index()
        keys = [self._calls._counts, self._calls._created]
        total, *flat = await self._calls._eval("count_jobs", "COUNT_JOBS", keys, [])
        counts = {status: int(float(n)) for status, n in zip(flat[::2], flat[1::2], strict=True)}
        counts.pop(Status.PENDING.value, None)  # not counted: the rest of the index
        counts[Status.PENDING.value] = int(total) - sum(counts.values())
        return {status: n for status, n in counts.items() if status and n > 0}

    async def _ensure_index(self) -> None:
        """Index the jobs stored before the creation index, once per store (a marker key)."""
        if self._index_ready:
            return
        marker = f"{self._calls._created}_ready"
        if not await self._calls._cmd("list_page", "EXISTS", marker):
            found = False
            async for names in self._calls._job_hashes(_BACKFILL_BATCH):
                keys = [self._calls._created, self._calls._counts, self._calls._names, *names]
                await self._calls._eval("list_page", "BACKFILL", keys, [])
                found = found or bool(names)
            if found or self._calls._create:  # a look at an empty namespace writes nothing
                await self._calls._cmd("list_page", "SET", marker, "1")
        self._index_ready = True

    # -- Cluster: no index (see the module docstring), a SCAN per call ---------------------

    async def _scanned(self, on_corrupt: CorruptSink | None) -> list[JobState]:
        jobs = []
        async for names in self._calls._job_hashes(_BACKFILL_BATCH):
            for name in names:
                key = self._calls._key_of(name)
                try:
                    reply = await self._calls._call("list_page", key, "GET", [])
                    if len(reply) > 1:
                        jobs.append(decode(key, reply[1:], reply[0]))
                except CorruptRecord as exc:
                    report_corrupt(exc, on_corrupt)
        return jobs

    async def _scanned_page(
        self,
        status: str | None,
        prefix: str | None,
        cursor: tuple[int, str] | None,
        limit: int,
        on_corrupt: CorruptSink | None,
    ) -> JobPage:
        def place(job: JobState) -> tuple[int, str]:
            return created_us(job.created_at), job.key

        # A corrupt record has no place in the order: it is reported with the first page.
        jobs = [
            job
            for job in await self._scanned(on_corrupt if cursor is None else _ignore)
            if (status is None or job.status.value == status)
            and (not prefix or job.key.startswith(prefix))
            and (cursor is None or place(job) < cursor)
        ]
        jobs.sort(key=place, reverse=True)
        if len(jobs) <= limit:
            return JobPage(jobs, None)
        return JobPage(jobs[:limit], encode_cursor(*place(jobs[limit - 1])))

    async def _scanned_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for job in await self._scanned(None):
            counts[job.status.value] = counts.get(job.status.value, 0) + 1
        return counts


def _ignore(exc: CorruptRecord) -> None:
    """A corrupt record already reported (with the first page)."""
