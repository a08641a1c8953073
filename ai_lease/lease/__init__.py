"""Leases: the store protocol, its SQLite and Redis implementations, and store URLs."""

from ai_lease.lease.base import (
    Acquired,
    AcquireOutcome,
    Fence,
    Finished,
    Following,
    LeaseStore,
    Renewal,
)
from ai_lease.lease.urls import mask_url, open_store

__all__ = [
    "AcquireOutcome",
    "Acquired",
    "Fence",
    "Finished",
    "Following",
    "LeaseStore",
    "Renewal",
    "mask_url",
    "open_store",
]
