"""What the commands that look at one job read through the client: its record, φ of its
owner's renewals, and what it waits for (``status``, ``status --watch``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from ai_lease.cli.output import ago
from ai_lease.observe.phi import OwnerPhi, owner_phi

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import JobState
    from ai_lease.lease.timeline import TimelineEntry

__all__ = ["Look", "job_and_phi", "waiting_text"]


class Look(NamedTuple):
    """One look at a job: its record (None: no such job), φ of its owner's renewals (None:
    not RUNNING, or a store that keeps no timeline; its ``value`` None: unknown), and what
    its owner waits for (``waiting for a slot of … (N ahead)``), or None."""

    job: JobState | None
    phi: OwnerPhi | None = None
    waiting: str | None = None


async def job_and_phi(client: Client, key: str) -> Look:
    """Job ``key``'s record, φ of its owner's renewals, and what it waits for: the record and
    one read of its timeline."""
    from ai_lease.lease.timeline import JobTimeline

    job = await client.status(key)
    if job is None or not client.serves(JobTimeline):
        return Look(job)
    entries, _ = await client.events(key)
    return Look(job, owner_phi(entries, job), waiting_text(entries, job))


def waiting_text(entries: Sequence[TimelineEntry], job: JobState) -> str | None:
    """What the owner waits for, from its timeline (:func:`~ai_lease.lease.timeline.slot_waiting`),
    and how long ago the wait began."""
    from ai_lease.lease.timeline import slot_waiting

    note = slot_waiting(entries, job)
    if note is None:
        return None
    return note.detail + (f", since {ago(job.read_at - note.at)}" if job.read_at else "")
