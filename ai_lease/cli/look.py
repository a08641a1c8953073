"""What the commands that look at one job read from the store: its record, and φ of its
owner's renewals (``status``, ``status --watch``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ai_lease.observe.phi import OwnerPhi, owner_phi

if TYPE_CHECKING:
    from ai_lease.job import JobState
    from ai_lease.lease import LeaseStore

__all__ = ["job_and_phi"]


async def job_and_phi(store: LeaseStore, key: str) -> tuple[JobState | None, OwnerPhi | None]:
    """Job ``key``'s record, and φ of its owner's renewals (None: not RUNNING, or a store
    that keeps no timeline; its ``value`` None: unknown)."""
    from ai_lease.lease.timeline import JobTimeline

    job = await store.get(key)
    if job is None or not isinstance(store, JobTimeline):
        return job, None
    entries, _ = await store.timeline(key)
    return job, owner_phi(entries, job)
