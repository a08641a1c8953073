"""The lease-store contract, run against SQLite and Redis (see ai_lease.testing.contract)."""

from ai_lease.testing.contract import (
    DurationHistoryContract,
    JobQueueContract,
    LeaseStoreContract,
)


class TestStoreContract(LeaseStoreContract):
    """Both built-in stores, via the parametrized ``store`` and ``store_url`` fixtures."""


class TestQueueContract(JobQueueContract):
    """Both built-in stores keep a job queue for workers."""


class TestHistoryContract(DurationHistoryContract):
    """Both built-in stores keep duration histograms."""
