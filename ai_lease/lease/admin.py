"""The jobs' lifecycle for people (``ai-lease retry`` / ``rm`` / ``prune``): the
:class:`JobAdmin` protocol and what ``remove`` answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ai_lease.job import JobState

__all__ = ["TERMINAL_STATUSES", "JobAdmin", "Removal"]


TERMINAL_STATUSES = frozenset({"DONE", "FAILED", "CANCELLED"})
"""The statuses ``prune`` may remove (all three unless told)."""


@dataclass(frozen=True, slots=True)
class Removal:
    """What ``remove`` did: ``removed`` false with a ``job`` means it was kept (RUNNING under
    a live lease, not forced); ``job`` None means there was no such job."""

    removed: bool
    job: JobState | None


@runtime_checkable
class JobAdmin(Protocol):
    """Operations for people on a store's jobs (both built-in stores implement it), each
    atomic: one script on Redis, one transaction on SQLite."""

    async def retry(self, key: str) -> JobState | None:
        """Send a FAILED or CANCELLED job back to PENDING with a fresh attempt budget, due
        for workers at once; any other job's record comes back unchanged (None: no job)."""
        ...

    async def remove(self, key: str, *, force: bool = False) -> Removal:
        """Delete the job's record, its queue entry, lease-index entry and recovery look;
        a RUNNING job under a live lease is kept unless ``force``."""
        ...

    async def prune(self, older_than: float, statuses: frozenset[str] = TERMINAL_STATUSES) -> int:
        """Delete the terminal jobs of ``statuses`` last written more than ``older_than``
        seconds ago (store clock); return how many."""
        ...
