"""The lease-store contract's writes: commit, fail, stall snapshots, listing and cancel.

Part of :class:`~ai_lease.testing.contract.LeaseStoreContract`, which every store passes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ai_lease.errors import FencingRejected
from ai_lease.job import Status
from ai_lease.lease.base import Fence, Finished, LeaseStore
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.refusal import Refusal
from ai_lease.testing.contract_support import key_for, own, renew


class WriteContract:
    """Fenced, idempotent writes and cancel (DESIGN.md invariants 1-2); a mixin of
    :class:`~ai_lease.testing.contract.LeaseStoreContract`."""

    # -- commit / fail ------------------------------------------------------------------------

    async def test_commit_by_stale_token_after_takeover_is_rejected(
        self, store: LeaseStore
    ) -> None:
        """The old owner's late write after a takeover is rejected, naming both fences."""
        key = key_for("fenced")
        old = await own(store, key, "A", ttl=0.2)
        await asyncio.sleep(0.4)
        new = await own(store, key, "B")
        with pytest.raises(FencingRejected) as info:
            await store.commit(old, "zombie result")
        assert info.value.held == old and info.value.current == new
        assert info.value.refusal is Refusal.NEWER_OWNER and info.value.code == "newer_owner"
        assert str(old.token) in str(info.value) and str(new.token) in str(info.value)
        job = await store.get(key)
        assert job is not None and job.status is Status.RUNNING and job.result is None

    async def test_equal_token_with_other_owner_is_rejected(self, store: LeaseStore) -> None:
        """The fence is the (token, owner) pair: an equal token from another owner does not pass."""
        key = key_for("pair")
        fence = await own(store, key, "A")
        with pytest.raises(FencingRejected) as imposter:
            await store.commit(Fence(key, "B", fence.token), "imposter")
        with pytest.raises(FencingRejected) as future:
            await store.commit(Fence(key, "A", fence.token + 1), "future token")
        assert imposter.value.refusal is future.value.refusal is Refusal.NEWER_OWNER
        assert imposter.value.current == future.value.current == fence

    async def test_commit_after_own_lapse_before_takeover_is_accepted(
        self, store: LeaseStore
    ) -> None:
        """A commit after the owner's own lease lapsed, with nobody else in, is still accepted."""
        key = key_for("slow")
        fence = await own(store, key, ttl=0.2)
        await asyncio.sleep(0.4)
        job = await store.commit(fence, "late but valid")
        assert job.status is Status.DONE and job.result == "late but valid"

    async def test_second_commit_returns_the_first_result(self, store: LeaseStore) -> None:
        """One result per key: a repeated commit returns the stored one; others are rejected."""
        key = key_for("once")
        fence = await own(store, key)
        first = await store.commit(fence, "first")
        again = await store.commit(fence, "second")
        assert first.result == again.result == "first"
        with pytest.raises(FencingRejected) as other:
            await store.commit(Fence(key, "B", fence.token + 1), "other")
        assert other.value.refusal is Refusal.ALREADY_COMMITTED
        done = await store.acquire(key, "C", ttl=5, max_no_progress=5)
        assert isinstance(done, Finished) and done.job.result == "first"

    async def test_commit_keeps_the_finish_reason(self, store: LeaseStore) -> None:
        """A capped answer's finish reason ("length") is kept in the DONE record; a plain
        commit keeps none."""
        capped, plain = key_for("capped"), key_for("plain")
        job = await store.commit(await own(store, capped), "r", finish_reason="length")
        assert job.finish_reason == "length"
        stored = await store.get(capped)
        assert stored is not None and stored.finish_reason == "length"
        await store.commit(await own(store, plain), "r")
        stored = await store.get(plain)
        assert stored is not None and stored.finish_reason is None

    async def test_commit_without_record_is_rejected(self, store: LeaseStore) -> None:
        """A commit for a key the store has no record of is rejected, not silently created."""
        key = key_for("ghost")
        with pytest.raises(FencingRejected) as ghost:
            await store.commit(Fence(key, "A", 1), "r")
        assert ghost.value.refusal is Refusal.MISSING and ghost.value.current is None
        assert await store.get(key) is None

    async def test_fail_is_terminal_and_fenced(self, store: LeaseStore) -> None:
        """fail() ends the job FAILED with its reason; stale fences cannot fail or commit it."""
        key = key_for("fail")
        fence = await own(store, key)
        with pytest.raises(FencingRejected) as stale:
            await store.fail(Fence(key, "B", fence.token), "not yours")
        assert stale.value.refusal is Refusal.NEWER_OWNER
        job = await store.fail(fence, "provider said 401")
        assert job.status is Status.FAILED and job.last_error == "provider said 401"
        assert (await store.fail(fence, "again")).last_error == "provider said 401"
        with pytest.raises(FencingRejected) as late:
            await store.commit(fence, "too late")
        assert late.value.refusal is Refusal.ALREADY_FINISHED
        outcome = await store.acquire(key, "B", ttl=5, max_no_progress=5)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.FAILED

    async def test_stall_snapshot_is_stored_for_current_owner_only(self, store: LeaseStore) -> None:
        """The owner's stall snapshot lands in the record; a stale fence's does not."""
        key = key_for("snap")
        fence = await own(store, key)
        snap = "stage 'call_ai' made no progress\n  File x.py, in read_stream"
        assert await store.report_stall(fence, "call_ai", snap)
        assert not await store.report_stall(Fence(key, "B", fence.token), "call_ai", "bogus")
        job = await store.get(key)
        assert job is not None and job.stall_snapshot == snap
        assert job.last_error == "stage 'call_ai' made no progress", "the header is the error"

    async def test_list_jobs_filters_by_status(self, store: LeaseStore) -> None:
        """list_jobs returns the stored jobs, and only one status when asked."""
        done, running, failed = key_for("ls-done"), key_for("ls-run"), key_for("ls-fail")
        await store.commit(await own(store, done), "r")
        await own(store, running)
        await store.fail(await own(store, failed), "broken")
        everything = {j.key: j.status for j in await store.list_jobs(limit=1000)}
        assert {done, running, failed} <= everything.keys()
        only_done = {j.key for j in await store.list_jobs(status="DONE", limit=1000)}
        assert done in only_done and not {running, failed} & only_done
        assert len(await store.list_jobs(limit=1)) == 1

    async def test_get_unknown_key_is_none(self, store: LeaseStore) -> None:
        """get() of a key never seen returns None."""
        assert await store.get(key_for("unknown")) is None

    # -- cancel -------------------------------------------------------------------------------

    async def test_cancelled_pending_job_never_runs(self, store: LeaseStore) -> None:
        """A PENDING job cancelled by key ends CANCELLED: a later acquire finds it finished."""
        key = key_for("cancel-pending")
        assert await store.release(await own(store, key), error="boom")
        job = await store.cancel(key, "not needed any more")
        assert job is not None and job.status is Status.CANCELLED
        assert job.last_error == "not needed any more"
        outcome = await store.acquire(key, "B", ttl=5, max_no_progress=5)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.CANCELLED

    async def test_cancel_fences_the_running_owner_out(self, store: LeaseStore) -> None:
        """Cancelling a RUNNING job refuses its owner's next renewal and rejects its commit."""
        key = key_for("cancel-running")
        fence = await own(store, key)
        cancelled = await store.cancel(key)
        assert cancelled is not None and cancelled.status is Status.CANCELLED
        renewal = await renew(store, fence, 5)
        assert not renewal.ok and renewal.reason is Refusal.NOT_RUNNING
        with pytest.raises(FencingRejected) as rejected:
            await store.commit(fence, "too late")
        assert rejected.value.code == "cancelled" and rejected.value.refusal is Refusal.CANCELLED
        assert not await store.release(fence)
        job = await store.get(key)
        assert job is not None and job.status is Status.CANCELLED and job.result is None

    async def test_cancel_leaves_a_finished_job_and_is_idempotent(self, store: LeaseStore) -> None:
        """A DONE job is not cancelled (its record comes back as it was); cancelling twice
        is the same as once; an unknown key gives None."""
        done, twice = key_for("cancel-done"), key_for("cancel-twice")
        await store.commit(await own(store, done), "r")
        job = await store.cancel(done)
        assert job is not None and job.status is Status.DONE and job.result == "r"
        await own(store, twice)
        first = await store.cancel(twice, "first reason")
        again = await store.cancel(twice, "second reason")
        assert first is not None and again is not None
        assert again.status is Status.CANCELLED and again.last_error == "first reason"
        assert await store.cancel(key_for("cancel-unknown")) is None

    async def test_follower_wakes_on_cancel(self, store: LeaseStore) -> None:
        """A waiting follower returns the CANCELLED record soon after the cancel."""
        key = key_for("cancel-wake")
        await own(store, key)

        async def cancel_soon() -> None:
            await asyncio.sleep(0.2)
            await store.cancel(key)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(cancel_soon())
            started = time.monotonic()
            outcome = await acquire_or_follow(
                store, key, "B", ttl=30, max_no_progress=5, poll_interval=1.0
            )
        assert isinstance(outcome, Finished) and outcome.job.status is Status.CANCELLED
        assert time.monotonic() - started < 1.5
