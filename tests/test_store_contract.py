"""The lease-store contract, run against SQLite and Redis (see ai_lease.testing.contract)."""

import asyncio
from typing import Any

from ai_lease.lease import Acquired
from ai_lease.testing.contract import (
    DurationHistoryContract,
    JobQueueContract,
    LeaseStoreContract,
    ListingContract,
    SlotContract,
    TimelineContract,
)

REAL_TIME = "real stores: a lease lapses on the store's own clock"


class TestStoreContract(LeaseStoreContract):
    """Both built-in stores, via the parametrized ``store`` and ``store_url`` fixtures."""


class TestQueueContract(JobQueueContract):
    """Both built-in stores keep a job queue for workers."""


class TestHistoryContract(DurationHistoryContract):
    """Both built-in stores keep duration histograms."""


class TestTimelineContract(TimelineContract):
    """Both built-in stores keep a bounded timeline per job."""


class TestListingContract(ListingContract):
    """Both built-in stores list pages of jobs off their own indexes."""


class TestSlotContract(SlotContract):
    """Every built-in store keeps provider slots."""


# -- recovery before fresh work (issue 12 C), on both stores ------------------------------------

CAPACITY = 4  # four workers, one job each


async def test_a_lapsed_job_comes_before_a_backlog_of_ten_times_capacity(store: Any) -> None:
    """A job whose owner died is due before 40 fresh jobs queued ahead of it (the worker
    re-queued it at read_at + ttl, behind them): the first due() after the lapse has it."""
    for n in range(10 * CAPACITY):
        await store.submit(f"fresh-{n}", "{}", "fp")
    await store.submit("abandoned", "{}", "fp")
    won = await store.acquire("abandoned", "dead-owner", ttl=0.3, max_no_progress=5)
    assert isinstance(won, Acquired)
    await store.reschedule("abandoned", won.job.read_at + 0.3)
    assert "abandoned" not in await store.due(CAPACITY), "its lease is still live"
    await asyncio.sleep(0.4)
    due = await store.due(CAPACITY)
    assert due[0] == "abandoned" and len(due) == CAPACITY


async def test_lapsed_jobs_are_bounded_per_sweep(store: Any) -> None:
    """Many lapsed leases at once: one due() hands out at most ``limit`` keys, the
    earliest lapse first."""
    for n in range(6):
        await store.submit(f"lapsed-{n}", "{}", "fp")
        won = await store.acquire(f"lapsed-{n}", "dead", ttl=0.2 + n * 0.01, max_no_progress=5)
        assert isinstance(won, Acquired)
        await store.reschedule(f"lapsed-{n}", won.job.read_at + 60)
    await asyncio.sleep(0.4)
    assert await store.due(3) == ["lapsed-0", "lapsed-1", "lapsed-2"]
