"""Leases: the store protocol, refusal codes, the SQLite and Redis stores, and store URLs."""

from ai_lease.lease.base import (
    Acquired,
    AcquireOutcome,
    Fence,
    Finished,
    Following,
    JobListing,
    JobPage,
    LeaseStore,
    Renewal,
)
from ai_lease.lease.refusal import Refusal
from ai_lease.lease.urls import open_store

__all__ = [
    "AcquireOutcome",
    "Acquired",
    "Fence",
    "Finished",
    "Following",
    "JobListing",
    "JobPage",
    "LeaseStore",
    "Refusal",
    "Renewal",
    "open_store",
]
