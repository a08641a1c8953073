"""What the jobs page leads with: counts by status and health, the jobs that need
attention, and the last hour per minute (queue depth, jobs done and failed).

Everything comes from the store's own records through its listing (``list_page``, or the
bounded ``list_jobs`` fallback of :func:`~ai_lease.ui.listing.read_page`): the newest
:data:`RUNNING_READ` running jobs (their health) and the newest :data:`RECENT_READ`
pending, done and failed ones (by creation, each status's own index). The work per read is
bounded whatever the store holds, so on a store with more jobs than that the health counts
and the per-minute figures are of those newest records, and the page says so. A finished
job counts in the minute of its ``finished_at``; a job was queued from ``created_at`` until
``started_at`` (its first acquisition) — both by the store's clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ai_lease.job import Health, JobState, Status
from ai_lease.lease.base import JobListing
from ai_lease.ui.listing import Filters, read_page

if TYPE_CHECKING:
    from ai_lease.client import Client

__all__ = [
    "ATTENTION_CAP",
    "MINUTES",
    "RECENT_READ",
    "RUNNING_READ",
    "Overview",
    "per_minute",
    "queue_depth",
    "read_overview",
]

RUNNING_READ = 500
"""Running jobs read for the health counts (the listing's largest page)."""
RECENT_READ = 200
"""Newest pending, done and failed jobs read for the per-minute charts and attention."""
ATTENTION_CAP = 20
"""Jobs listed under "needs attention" at most."""
MINUTES = 60

_SEVERITY = {Health.DEAD: 0, Health.ZOMBIE: 1, Health.NODE_LOST: 2}


@dataclass(frozen=True, slots=True)
class Overview:
    """The jobs page's summary. ``sampled``: the store holds more running jobs than were
    read, so the health counts are of the newest :data:`RUNNING_READ`."""

    statuses: list[tuple[str, int]]
    healths: list[tuple[str, int]]
    attention: list[JobState]
    queued: list[int]  # jobs waiting at each minute's end, oldest minute first
    done: list[int]  # jobs DONE in each minute
    failed: list[int]  # jobs FAILED in each minute
    sampled: bool = False
    now: float = field(default=0.0)


async def read_overview(client: Client) -> Overview:
    """The summary of ``client``'s store: a count read and four bounded listing reads."""
    counts: dict[str, int] = await client.counts() if client.serves(JobListing) else {}
    running = await _newest(client, Status.RUNNING, RUNNING_READ)
    pending = await _newest(client, Status.PENDING, RECENT_READ)
    done = await _newest(client, Status.DONE, RECENT_READ)
    failed = await _newest(client, Status.FAILED, RECENT_READ)
    every = [*running, *pending, *done, *failed]
    now = max((job.read_at for job in every), default=0.0) or time.time()
    return Overview(
        statuses=[(s.value, counts.get(s.value, 0)) for s in Status] if counts else [],
        healths=_health_counts(running),
        attention=_attention(running, pending, failed),
        queued=_queued(every, now, counts),
        done=per_minute(done, now),
        failed=per_minute(failed, now),
        sampled=counts.get(Status.RUNNING.value, 0) > len(running),
        now=now,
    )


async def _newest(client: Client, status: Status, limit: int) -> list[JobState]:
    return (await read_page(client, Filters(status=status.value), limit)).jobs


def _queued(jobs: list[JobState], now: float, counts: dict[str, int]) -> list[int]:
    """The queue depth per minute; its last point the store's own count when it has one."""
    depth = queue_depth(jobs, now)
    if counts:
        depth[-1] = counts.get(Status.PENDING.value, 0)
    return depth


def _health_counts(running: list[JobState]) -> list[tuple[str, int]]:
    found = [job.health() for job in running]
    return [(h.value, sum(1 for seen in found if seen is h)) for h in Health]


def _attention(
    running: list[JobState], pending: list[JobState], failed: list[JobState]
) -> list[JobState]:
    """Unhealthy running jobs (dead, zombie, node lost), then pending ones that failed an
    attempt (waiting to retry), then the newest failed: at most :data:`ATTENTION_CAP`."""
    sick = [job for job in running if job.health() in _SEVERITY]
    sick.sort(key=lambda job: _SEVERITY[job.health() or Health.DEAD])
    retrying = [job for job in pending if job.last_error]
    return [*sick, *retrying, *failed][:ATTENTION_CAP]


def per_minute(jobs: list[JobState], now: float, minutes: int = MINUTES) -> list[int]:
    """How many of ``jobs`` finished in each of the last ``minutes`` minutes before ``now``
    (oldest first; the last bucket ends at ``now``)."""
    counts = [0] * minutes
    for job in jobs:
        if job.finished_at is None:
            continue
        back = int((now - job.finished_at) // 60)
        if 0 <= back < minutes:
            counts[minutes - 1 - back] += 1
    return counts


def queue_depth(jobs: list[JobState], now: float, minutes: int = MINUTES) -> list[int]:
    """How many of ``jobs`` were waiting (created, not yet started) at the end of each of
    the last ``minutes`` minutes (oldest first; the last point is ``now``)."""
    ends = [now - 60 * (minutes - 1 - i) for i in range(minutes)]
    return [sum(1 for job in jobs if _waiting(job, at)) for at in ends]


def _waiting(job: JobState, at: float) -> bool:
    """Whether ``job`` was queued at ``at``: from its creation to its first start (or its
    end, if it never started); a PENDING one handed back after a start, since that."""
    if job.status is Status.PENDING and job.started_at is not None:
        return job.updated_at <= at
    if not job.created_at or job.created_at > at:
        return False
    end = job.started_at
    if end is None and job.status is not Status.PENDING:
        end = job.finished_at or job.updated_at
    return end is None or end > at
