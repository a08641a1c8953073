"""What the dashboard reads through its client: one page of jobs, filtered, newest first; the
live workers with the jobs they still run (:func:`read_workers`, which ``ai-lease workers``
shares).

A store with the listing API (``list_page``: an index it keeps, bounded work per call) is
asked for exactly one page. A store without it is read through ``list_jobs`` and sorted
here (bounded by :data:`FALLBACK_LIMIT`), so the page works either way. Health is judged
from each record (``JobState.health()``), so a health filter narrows the page it is given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ai_lease.errors import CorruptRecord
from ai_lease.job import Health, JobState, Status
from ai_lease.lease.base import JobListing
from ai_lease.lease.queue import WorkerInfo

if TYPE_CHECKING:
    from ai_lease.client import Client

__all__ = [
    "HEALTHS",
    "PAGE_SIZE",
    "STATUSES",
    "Filters",
    "Page",
    "Workers",
    "read_page",
    "read_workers",
]

PAGE_SIZE = 50
FALLBACK_LIMIT = 10_000
STATUSES = tuple(s.value for s in Status)
HEALTHS = tuple(h.value for h in Health)


@dataclass(frozen=True, slots=True)
class Filters:
    """The jobs page's query: status, health, key prefix and the page cursor (all optional;
    unknown values are dropped, never passed to the store)."""

    status: str | None = None
    health: str | None = None
    prefix: str | None = None
    after: str | None = None

    @classmethod
    def from_query(cls, query: Any) -> Filters:
        """Filters from a request's query parameters."""
        status = (query.get("status") or "").upper() or None
        health = (query.get("health") or "").replace("-", " ").lower() or None
        return cls(
            status=status if status in STATUSES else None,
            health=health if health in HEALTHS else None,
            prefix=query.get("prefix") or None,
            after=query.get("after") or None,
        )

    def query(self, *, after: str | None = None) -> dict[str, str]:
        """The filters as query parameters (``after`` for another page)."""
        values = {"status": self.status, "health": self.health, "prefix": self.prefix}
        values["after"] = after
        return {name: value for name, value in values.items() if value}


@dataclass(frozen=True, slots=True)
class Page:
    """One page of jobs, the cursor of the next one (None: the last page), and the stored
    entries of this page that are no job record (shown marked, never skipped unseen)."""

    jobs: list[JobState]
    next_cursor: str | None
    corrupt: list[CorruptRecord] = field(default_factory=list)


async def read_page(client: Client, filters: Filters, limit: int = PAGE_SIZE) -> Page:
    """One store read: the page of jobs ``filters`` select, newest first."""
    status = filters.status
    corrupt: list[CorruptRecord] = []
    if filters.health is not None:
        status = Status.RUNNING.value  # only a running job has a health
    if client.serves(JobListing):
        try:
            page = await client.jobs(
                status=status,
                prefix=filters.prefix,
                after=filters.after,
                limit=limit,
                on_corrupt=corrupt.append,
            )
        except ValueError:  # a cursor no page gave (edited, or another store's): page one
            page = await client.jobs(
                status=status, prefix=filters.prefix, limit=limit, on_corrupt=corrupt.append
            )
        jobs, cursor = list(page.jobs), page.next_cursor
    else:
        jobs, cursor = await _fallback(client, status, filters, limit, corrupt)
    if filters.health is not None:
        jobs, corrupt = [job for job in jobs if _health(job) == filters.health], []
    return Page(jobs, cursor, corrupt)


async def _fallback(
    client: Client, status: str | None, filters: Filters, limit: int, corrupt: list[CorruptRecord]
) -> tuple[list[JobState], str | None]:
    """A page cut from ``list_jobs`` (a store without ``list_page``); the cursor is an offset."""
    jobs = await client.list(status=status, limit=FALLBACK_LIMIT, on_corrupt=corrupt.append)
    if filters.prefix:
        jobs = [job for job in jobs if job.key.startswith(filters.prefix)]
        corrupt[:] = [bad for bad in corrupt if bad.key.startswith(filters.prefix)]
    jobs.sort(key=lambda job: (job.created_at, job.key), reverse=True)
    after = filters.after or ""
    start = int(after) if after.isdigit() else 0
    end = start + limit
    return jobs[start:end], (str(end) if end < len(jobs) else None)


def _health(job: JobState) -> str | None:
    health = job.health()
    return None if health is None else health.value


@dataclass(frozen=True, slots=True)
class Workers:
    """The live workers, each with only the jobs its own records say still run; the entries
    that are no worker record; and ``read_at``, the clock to judge "last seen" by: the
    store's (the latest of the records read), or this machine's when no record was read."""

    found: list[WorkerInfo]
    corrupt: list[CorruptRecord]
    read_at: float
    records: dict[str, JobState] = field(default_factory=dict)  # each still-running job's


async def read_workers(client: Client) -> Workers:
    """The live workers of ``client``'s store. A worker reports its jobs at its beats, so a
    job that ended (or was handed back) since would show as running: each reported job's
    record is read now (at most MAX_REPORTED_JOBS per worker) and the ones not RUNNING are
    left out, the worker's running count lowered by as many."""
    corrupt: list[CorruptRecord] = []
    listed = await client.workers(on_corrupt=corrupt.append)
    clocks: list[float] = []
    records: dict[str, JobState] = {}
    found = [await _still_running(client, info, clocks, records) for info in listed]
    return Workers(found, corrupt, max(clocks, default=time.time()), records)


async def _still_running(
    client: Client, info: WorkerInfo, clocks: list[float], records: dict[str, JobState]
) -> WorkerInfo:
    if not info.jobs:
        return info
    kept = []
    for key in info.jobs:
        try:
            job = await client.status(key)
        except CorruptRecord:  # no record of a running job: not shown as one
            continue
        if job is not None and job.read_at:
            clocks.append(job.read_at)
        if job is not None and job.status is Status.RUNNING:
            kept.append(key)
            records[key] = job
    running = max(0, info.running - (len(info.jobs) - len(kept)))
    return replace(info, jobs=tuple(kept), running=running)
