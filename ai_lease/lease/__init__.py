"""Leases: the store protocols and their answers, the rules, refusal codes, fencing and
renewal. The stores that keep them are in :mod:`ai_lease.stores`."""

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
]
