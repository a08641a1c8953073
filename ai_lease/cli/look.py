"""What the commands that look at one job read through the client: its record, and φ of
its owner's renewals (``status``, ``status --watch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ai_lease.observe.phi import OwnerPhi, owner_phi

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import JobState

__all__ = ["job_and_phi"]


async def job_and_phi(client: Client, key: str) -> tuple[JobState | None, OwnerPhi | None]:
    """Job ``key``'s record, and φ of its owner's renewals (None: not RUNNING, or a store
    that keeps no timeline; its ``value`` None: unknown)."""
    from ai_lease.lease.timeline import JobTimeline

    job = await client.status(key)
    if job is None or not client.serves(JobTimeline):
        return job, None
    entries, _ = await client.events(key)
    return job, owner_phi(entries, job)
