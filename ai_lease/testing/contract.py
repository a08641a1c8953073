"""The lease-store contract: every :class:`~ai_lease.lease.base.LeaseStore` must pass it.

A third-party store tests itself by subclassing and providing two fixtures::

    from ai_lease.testing.contract import LeaseStoreContract

    class TestMyStore(LeaseStoreContract):
        @pytest.fixture
        async def store(self):
            store = MyStore(...)
            yield store
            await store.aclose()

        @pytest.fixture
        def store_url(self):       # for the multi-process race; None if open_store can't open it
            return None

Timing tests use small budgets and generous bounds (never exact sleeps).
Needs pytest-asyncio in auto mode.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson
import pytest

from ai_lease.errors import JobConflict
from ai_lease.job import Status
from ai_lease.lease.base import Acquired, Fence, Finished, Following, LeaseStore
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.refusal import Refusal
from ai_lease.testing.contract_checkpoint import CheckpointContract
from ai_lease.testing.contract_failure import FailureContract
from ai_lease.testing.contract_listing import ListingContract
from ai_lease.testing.contract_queue import DurationHistoryContract, JobQueueContract
from ai_lease.testing.contract_record import RecordContract
from ai_lease.testing.contract_slots import SlotContract
from ai_lease.testing.contract_support import key_for, own, renew
from ai_lease.testing.contract_timeline import TimelineContract
from ai_lease.testing.contract_writes import WriteContract

__all__ = [
    "DurationHistoryContract",
    "JobQueueContract",
    "LeaseStoreContract",
    "ListingContract",
    "SlotContract",
    "TimelineContract",
]


class LeaseStoreContract(WriteContract, RecordContract, CheckpointContract, FailureContract):
    """The behaviour every lease store promises (DESIGN.md invariants 1-4)."""

    # -- acquire -----------------------------------------------------------------------------

    async def test_first_acquirer_owns_and_others_follow(self, store: LeaseStore) -> None:
        """The first acquirer gets a token; a second node follows, told the owner and expiry."""
        key = key_for("own")
        fence = await own(store, key, "A", ttl=20)
        other = await store.acquire(key, "B", ttl=20, max_no_progress=5)
        assert isinstance(other, Following)
        assert other.owner_id == "A" and other.job.token == fence.token
        assert 15 < other.lease_remaining <= 20
        job = await store.get(key)
        assert job is not None and job.status is Status.RUNNING and job.attempts == 1

    async def test_repeated_acquire_by_owner_returns_same_token(self, store: LeaseStore) -> None:
        """An acquire repeated by the same owner (a lost reply) returns the same token."""
        key = key_for("repeat")
        first = await own(store, key, "A")
        again = await own(store, key, "A")
        assert again == first
        job = await store.get(key)
        assert job is not None and job.attempts == 1

    async def test_racing_tasks_yield_exactly_one_owner(self, store: LeaseStore) -> None:
        """Fifty tasks racing for one key: exactly one owner, everyone else follows it."""
        key = key_for("race")
        outcomes = await asyncio.gather(
            *(store.acquire(key, f"n{i}", ttl=30, max_no_progress=5) for i in range(50))
        )
        owners = [o for o in outcomes if isinstance(o, Acquired)]
        assert len(owners) == 1
        assert all(
            isinstance(o, Following) and o.owner_id == owners[0].fence.owner_id
            for o in outcomes
            if o is not owners[0]
        )

    async def test_racing_processes_yield_one_owner_perkey_for(
        self, store: LeaseStore, store_url: str | None
    ) -> None:
        """Six OS processes racing for eight keys at once: exactly one owner per key."""
        if store_url is None:
            pytest.skip("this store cannot be opened from a URL in another process")
        keys = [key_for(f"proc{i}") for i in range(8)]
        start_at = time.time() + 1.5
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "ai_lease.testing.race",
                store_url,
                str(start_at),
                f"proc-{p}",
                *keys,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for p in range(6)
        ]
        rows = []
        for proc in procs:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            rows += [orjson.loads(line) for line in out.splitlines()]
        for key in keys:
            won = [r for r in rows if r["key"] == key and r["outcome"] == "Acquired"]
            assert len(won) == 1, (key, won)
            job = await store.get(key)
            assert job is not None and job.token == won[0]["token"]

    async def test_tokens_strictly_increase_perkey_for(self, store: LeaseStore) -> None:
        """Every new acquisition of a key carries a larger token than the one before."""
        key = key_for("tokens")
        tokens = []
        for i in range(20):
            fence = await own(store, key, f"n{i}")
            tokens.append(fence.token)
            assert await store.release(fence)
        assert tokens == sorted(set(tokens)) and len(tokens) == 20

    async def test_release_lets_another_owner_in_at_once(self, store: LeaseStore) -> None:
        """A released lease is free at once: the next node takes over with a higher token."""
        key = key_for("release")
        first = await own(store, key, "A")
        assert await store.release(first, error="stepping down")
        taken = await store.acquire(key, "B", ttl=30, max_no_progress=5)
        assert isinstance(taken, Acquired) and taken.takeover
        assert taken.fence.token > first.token
        assert taken.job.last_error == "stepping down"
        assert not await store.release(first), "a stale fence cannot release the new owner"

    async def test_lapsed_lease_is_taken_over_with_higher_token(self, store: LeaseStore) -> None:
        """Once the owner's lease lapses (store clock), another node takes over, token higher."""
        key = key_for("lapse")
        first = await own(store, key, "A", ttl=0.3)
        assert isinstance(await store.acquire(key, "B", ttl=5, max_no_progress=5), Following)
        await asyncio.sleep(0.5)
        taken = await store.acquire(key, "B", ttl=5, max_no_progress=5)
        assert isinstance(taken, Acquired) and taken.takeover and taken.fence.token > first.token
        job = await store.get(key)
        assert job is not None and job.takeovers == 1 and job.attempts == 2

    async def test_max_attempts_ends_failed_with_reason(self, store: LeaseStore) -> None:
        """After the last attempt's lease lapses, the next acquire ends the job FAILED."""
        key = key_for("attempts")
        for owner in ("A", "B"):
            fence = await own(store, key, owner, max_attempts=2)
            await store.release(fence, error=f"{owner} crashed")
        outcome = await store.acquire(key, "C", ttl=5, max_no_progress=5, max_attempts=2)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.FAILED
        assert "2 attempts" in (outcome.job.last_error or "")
        assert "B crashed" in (outcome.job.last_error or "")

    async def test_different_payload_under_same_key_conflicts(self, store: LeaseStore) -> None:
        """The same key with another payload fingerprint is a conflict; the record is untouched."""
        key = key_for("conflict")
        fence = await own(store, key, "A", fingerprint="aaa")
        before = await store.get(key)
        with pytest.raises(JobConflict):
            await store.acquire(key, "B", ttl=5, max_no_progress=5, fingerprint="bbb")
        after = await store.get(key)
        assert before is not None and after is not None
        assert (after.token, after.owner_id, after.fingerprint) == (fence.token, "A", "aaa")
        same = await store.acquire(key, "B", ttl=5, max_no_progress=5, fingerprint="aaa")
        assert isinstance(same, Following)

    # -- renew --------------------------------------------------------------------------------

    async def test_renew_by_owner_with_progress_extends(self, store: LeaseStore) -> None:
        """A renewal with fresh progress extends the lease and records stage and version."""
        key = key_for("renew")
        fence = await own(store, key, ttl=5)
        answer = await renew(store, fence, 1, ttl=20)
        assert answer.ok and answer.lease_remaining == pytest.approx(20)
        job = await store.get(key)
        assert job is not None
        assert (job.stage, job.progress_version) == ("call_ai", 1)
        assert 15 < job.lease_remaining <= 20

    async def test_renew_by_non_owner_or_stale_token_is_refused(self, store: LeaseStore) -> None:
        """A renewal carrying another owner id, or an older token, is refused as not_owner."""
        key = key_for("stale")
        fence = await own(store, key)
        for bad in (Fence(key, "B", fence.token), Fence(key, "A", fence.token - 1)):
            answer = await renew(store, bad, 1)
            assert not answer.ok and answer.reason is Refusal.NOT_OWNER
            assert answer.current == fence
        missing = await renew(store, Fence(key_for("none"), "A", 1), 1)
        assert not missing.ok and missing.reason is Refusal.MISSING

    async def test_renew_without_progress_past_budget_is_refused(self, store: LeaseStore) -> None:
        """A heartbeat with no new progress past budget + grace is refused: no blind renewals."""
        key = key_for("zombie")
        fence = await own(store, key, ttl=5, mnp=0.2)
        assert (await renew(store, fence, 1, mnp=0.2, grace=0.1, ttl=5)).ok
        await asyncio.sleep(0.5)
        blind = await renew(store, fence, 1, mnp=0.2, grace=0.1, ttl=5)
        assert not blind.ok and blind.reason is Refusal.NO_PROGRESS
        assert blind.current == fence
        job = await store.get(key)
        assert job is not None and job.missed_renewals == 1
        assert job.lease_remaining < 5, "a refused renewal must not extend the lease"
        assert (await renew(store, fence, 2, mnp=0.2, grace=0.1, ttl=5)).ok, "progress resumes"

    async def test_alert_policy_renews_but_counts_the_miss(self, store: LeaseStore) -> None:
        """Under the alert policy a stalled job keeps its lease, and the miss is recorded."""
        key = key_for("alert")
        fence = await own(store, key, ttl=5, mnp=0.2, stall_policy="alert")
        await asyncio.sleep(0.5)
        answer = await renew(store, fence, 0, mnp=0.2, grace=0.1, ttl=5)
        assert answer.ok and answer.stalled
        job = await store.get(key)
        assert job is not None and job.missed_renewals == 1 and job.lease_remaining > 4

    async def test_renew_after_lapse_or_finish_is_refused(self, store: LeaseStore) -> None:
        """A lapsed lease is not revived by a late renewal; a finished job is not renewed."""
        key = key_for("late")
        fence = await own(store, key, ttl=0.2)
        await asyncio.sleep(0.4)
        assert (await renew(store, fence, 1)).reason is Refusal.EXPIRED
        await store.commit(fence, "r")
        assert (await renew(store, fence, 2)).reason is Refusal.NOT_RUNNING

    # -- following ----------------------------------------------------------------------------

    async def test_follower_wakes_on_done(self, store: LeaseStore) -> None:
        """A waiting follower returns the owner's result soon after the commit."""
        key = key_for("wake")
        fence = await own(store, key)

        async def commit_soon() -> None:
            await asyncio.sleep(0.2)
            await store.commit(fence, "the result")

        async with asyncio.TaskGroup() as tg:
            tg.create_task(commit_soon())
            started = time.monotonic()
            outcome = await acquire_or_follow(
                store, key, "B", ttl=30, max_no_progress=5, poll_interval=1.0
            )
        assert isinstance(outcome, Finished) and outcome.job.result == "the result"
        assert time.monotonic() - started < 1.5

    async def test_follower_takes_over_on_lapse(self, store: LeaseStore) -> None:
        """A waiting follower competes again when the owner's lease lapses, and wins."""
        key = key_for("lapse-follow")
        old = await own(store, key, "A", ttl=0.5)
        started = time.monotonic()
        outcome = await acquire_or_follow(
            store, key, "B", ttl=30, max_no_progress=5, poll_interval=5.0
        )
        assert isinstance(outcome, Acquired) and outcome.fence.token > old.token
        assert 0.3 < time.monotonic() - started < 2.0
