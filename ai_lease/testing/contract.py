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
import itertools
import sys
import time
from typing import Any

import orjson
import pytest

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.job import Status
from ai_lease.lease.base import Acquired, Fence, Finished, Following, LeaseStore
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.lease.refusal import Refusal

__all__ = ["DurationHistoryContract", "JobQueueContract", "LeaseStoreContract"]

_ids = itertools.count()


def _key(name: str) -> str:
    return f"contract-{name}-{time.time_ns()}-{next(_ids)}"


async def _own(
    store: LeaseStore, key: str, owner: str = "A", ttl: float = 30.0, **kw: Any
) -> Fence:
    outcome = await store.acquire(key, owner, ttl=ttl, max_no_progress=kw.pop("mnp", 30.0), **kw)
    assert isinstance(outcome, Acquired), outcome
    return outcome.fence


async def _renew(
    store: LeaseStore,
    fence: Fence,
    version: int,
    mnp: float = 30.0,
    ttl: float = 30.0,
    grace: float = 0.0,
) -> Any:
    return await store.renew(
        fence, ttl=ttl, stage="call_ai", progress_version=version, max_no_progress=mnp, grace=grace
    )


class LeaseStoreContract:
    """The behaviour every lease store promises (DESIGN.md invariants 1-4)."""

    # -- acquire -----------------------------------------------------------------------------

    async def test_first_acquirer_owns_and_others_follow(self, store: LeaseStore) -> None:
        """The first acquirer gets a token; a second node follows, told the owner and expiry."""
        key = _key("own")
        fence = await _own(store, key, "A", ttl=20)
        other = await store.acquire(key, "B", ttl=20, max_no_progress=5)
        assert isinstance(other, Following)
        assert other.owner_id == "A" and other.job.token == fence.token
        assert 15 < other.lease_remaining <= 20
        job = await store.get(key)
        assert job is not None and job.status is Status.RUNNING and job.attempts == 1

    async def test_repeated_acquire_by_owner_returns_same_token(self, store: LeaseStore) -> None:
        """An acquire repeated by the same owner (a lost reply) returns the same token."""
        key = _key("repeat")
        first = await _own(store, key, "A")
        again = await _own(store, key, "A")
        assert again == first
        job = await store.get(key)
        assert job is not None and job.attempts == 1

    async def test_racing_tasks_yield_exactly_one_owner(self, store: LeaseStore) -> None:
        """Fifty tasks racing for one key: exactly one owner, everyone else follows it."""
        key = _key("race")
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

    async def test_racing_processes_yield_one_owner_per_key(
        self, store: LeaseStore, store_url: str | None
    ) -> None:
        """Six OS processes racing for eight keys at once: exactly one owner per key."""
        if store_url is None:
            pytest.skip("this store cannot be opened from a URL in another process")
        keys = [_key(f"proc{i}") for i in range(8)]
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

    async def test_tokens_strictly_increase_per_key(self, store: LeaseStore) -> None:
        """Every new acquisition of a key carries a larger token than the one before."""
        key = _key("tokens")
        tokens = []
        for i in range(20):
            fence = await _own(store, key, f"n{i}")
            tokens.append(fence.token)
            assert await store.release(fence)
        assert tokens == sorted(set(tokens)) and len(tokens) == 20

    async def test_release_lets_another_owner_in_at_once(self, store: LeaseStore) -> None:
        """A released lease is free at once: the next node takes over with a higher token."""
        key = _key("release")
        first = await _own(store, key, "A")
        assert await store.release(first, error="stepping down")
        taken = await store.acquire(key, "B", ttl=30, max_no_progress=5)
        assert isinstance(taken, Acquired) and taken.takeover
        assert taken.fence.token > first.token
        assert taken.job.last_error == "stepping down"
        assert not await store.release(first), "a stale fence cannot release the new owner"

    async def test_lapsed_lease_is_taken_over_with_higher_token(self, store: LeaseStore) -> None:
        """Once the owner's lease lapses (store clock), another node takes over, token higher."""
        key = _key("lapse")
        first = await _own(store, key, "A", ttl=0.3)
        assert isinstance(await store.acquire(key, "B", ttl=5, max_no_progress=5), Following)
        await asyncio.sleep(0.5)
        taken = await store.acquire(key, "B", ttl=5, max_no_progress=5)
        assert isinstance(taken, Acquired) and taken.takeover and taken.fence.token > first.token
        job = await store.get(key)
        assert job is not None and job.takeovers == 1 and job.attempts == 2

    async def test_max_attempts_ends_failed_with_reason(self, store: LeaseStore) -> None:
        """After the last attempt's lease lapses, the next acquire ends the job FAILED."""
        key = _key("attempts")
        for owner in ("A", "B"):
            fence = await _own(store, key, owner, max_attempts=2)
            await store.release(fence, error=f"{owner} crashed")
        outcome = await store.acquire(key, "C", ttl=5, max_no_progress=5, max_attempts=2)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.FAILED
        assert "2 attempts" in (outcome.job.last_error or "")
        assert "B crashed" in (outcome.job.last_error or "")

    async def test_different_payload_under_same_key_conflicts(self, store: LeaseStore) -> None:
        """The same key with another payload fingerprint is a conflict; the record is untouched."""
        key = _key("conflict")
        fence = await _own(store, key, "A", fingerprint="aaa")
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
        key = _key("renew")
        fence = await _own(store, key, ttl=5)
        answer = await _renew(store, fence, 1, ttl=20)
        assert answer.ok and answer.lease_remaining == pytest.approx(20)
        job = await store.get(key)
        assert job is not None
        assert (job.stage, job.progress_version) == ("call_ai", 1)
        assert 15 < job.lease_remaining <= 20

    async def test_renew_by_non_owner_or_stale_token_is_refused(self, store: LeaseStore) -> None:
        """A renewal carrying another owner id, or an older token, is refused as not_owner."""
        key = _key("stale")
        fence = await _own(store, key)
        for bad in (Fence(key, "B", fence.token), Fence(key, "A", fence.token - 1)):
            answer = await _renew(store, bad, 1)
            assert not answer.ok and answer.reason is Refusal.NOT_OWNER
            assert answer.current == fence
        missing = await _renew(store, Fence(_key("none"), "A", 1), 1)
        assert not missing.ok and missing.reason is Refusal.MISSING

    async def test_renew_without_progress_past_budget_is_refused(self, store: LeaseStore) -> None:
        """A heartbeat with no new progress past budget + grace is refused: no blind renewals."""
        key = _key("zombie")
        fence = await _own(store, key, ttl=5, mnp=0.2)
        assert (await _renew(store, fence, 1, mnp=0.2, grace=0.1, ttl=5)).ok
        await asyncio.sleep(0.5)
        blind = await _renew(store, fence, 1, mnp=0.2, grace=0.1, ttl=5)
        assert not blind.ok and blind.reason is Refusal.NO_PROGRESS
        assert blind.current == fence
        job = await store.get(key)
        assert job is not None and job.missed_renewals == 1
        assert job.lease_remaining < 5, "a refused renewal must not extend the lease"
        assert (await _renew(store, fence, 2, mnp=0.2, grace=0.1, ttl=5)).ok, "progress resumes"

    async def test_alert_policy_renews_but_counts_the_miss(self, store: LeaseStore) -> None:
        """Under the alert policy a stalled job keeps its lease, and the miss is recorded."""
        key = _key("alert")
        fence = await _own(store, key, ttl=5, mnp=0.2, stall_policy="alert")
        await asyncio.sleep(0.5)
        answer = await _renew(store, fence, 0, mnp=0.2, grace=0.1, ttl=5)
        assert answer.ok and answer.stalled
        job = await store.get(key)
        assert job is not None and job.missed_renewals == 1 and job.lease_remaining > 4

    async def test_renew_after_lapse_or_finish_is_refused(self, store: LeaseStore) -> None:
        """A lapsed lease is not revived by a late renewal; a finished job is not renewed."""
        key = _key("late")
        fence = await _own(store, key, ttl=0.2)
        await asyncio.sleep(0.4)
        assert (await _renew(store, fence, 1)).reason is Refusal.EXPIRED
        await store.commit(fence, "r")
        assert (await _renew(store, fence, 2)).reason is Refusal.NOT_RUNNING

    # -- commit / fail ------------------------------------------------------------------------

    async def test_commit_by_stale_token_after_takeover_is_rejected(
        self, store: LeaseStore
    ) -> None:
        """The old owner's late write after a takeover is rejected, naming both fences."""
        key = _key("fenced")
        old = await _own(store, key, "A", ttl=0.2)
        await asyncio.sleep(0.4)
        new = await _own(store, key, "B")
        with pytest.raises(FencingRejected) as info:
            await store.commit(old, "zombie result")
        assert info.value.held == old and info.value.current == new
        assert info.value.refusal is Refusal.NEWER_OWNER and info.value.code == "newer_owner"
        assert str(old.token) in str(info.value) and str(new.token) in str(info.value)
        job = await store.get(key)
        assert job is not None and job.status is Status.RUNNING and job.result is None

    async def test_equal_token_with_other_owner_is_rejected(self, store: LeaseStore) -> None:
        """The fence is the (token, owner) pair: an equal token from another owner does not pass."""
        key = _key("pair")
        fence = await _own(store, key, "A")
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
        key = _key("slow")
        fence = await _own(store, key, ttl=0.2)
        await asyncio.sleep(0.4)
        job = await store.commit(fence, "late but valid")
        assert job.status is Status.DONE and job.result == "late but valid"

    async def test_second_commit_returns_the_first_result(self, store: LeaseStore) -> None:
        """One result per key: a repeated commit returns the stored one; others are rejected."""
        key = _key("once")
        fence = await _own(store, key)
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
        capped, plain = _key("capped"), _key("plain")
        job = await store.commit(await _own(store, capped), "r", finish_reason="length")
        assert job.finish_reason == "length"
        stored = await store.get(capped)
        assert stored is not None and stored.finish_reason == "length"
        await store.commit(await _own(store, plain), "r")
        stored = await store.get(plain)
        assert stored is not None and stored.finish_reason is None

    async def test_commit_without_record_is_rejected(self, store: LeaseStore) -> None:
        """A commit for a key the store has no record of is rejected, not silently created."""
        key = _key("ghost")
        with pytest.raises(FencingRejected) as ghost:
            await store.commit(Fence(key, "A", 1), "r")
        assert ghost.value.refusal is Refusal.MISSING and ghost.value.current is None
        assert await store.get(key) is None

    async def test_fail_is_terminal_and_fenced(self, store: LeaseStore) -> None:
        """fail() ends the job FAILED with its reason; stale fences cannot fail or commit it."""
        key = _key("fail")
        fence = await _own(store, key)
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
        key = _key("snap")
        fence = await _own(store, key)
        snap = "stage 'call_ai' made no progress\n  File x.py, in read_stream"
        assert await store.report_stall(fence, "call_ai", snap)
        assert not await store.report_stall(Fence(key, "B", fence.token), "call_ai", "bogus")
        job = await store.get(key)
        assert job is not None and job.stall_snapshot == snap
        assert job.last_error == "stage 'call_ai' made no progress", "the header is the error"

    async def test_list_jobs_filters_by_status(self, store: LeaseStore) -> None:
        """list_jobs returns the stored jobs, and only one status when asked."""
        done, running, failed = _key("ls-done"), _key("ls-run"), _key("ls-fail")
        await store.commit(await _own(store, done), "r")
        await _own(store, running)
        await store.fail(await _own(store, failed), "broken")
        everything = {j.key: j.status for j in await store.list_jobs(limit=1000)}
        assert {done, running, failed} <= everything.keys()
        only_done = {j.key for j in await store.list_jobs(status="DONE", limit=1000)}
        assert done in only_done and not {running, failed} & only_done
        assert len(await store.list_jobs(limit=1)) == 1

    async def test_get_unknown_key_is_none(self, store: LeaseStore) -> None:
        """get() of a key never seen returns None."""
        assert await store.get(_key("unknown")) is None

    # -- cancel -------------------------------------------------------------------------------

    async def test_cancelled_pending_job_never_runs(self, store: LeaseStore) -> None:
        """A PENDING job cancelled by key ends CANCELLED: a later acquire finds it finished."""
        key = _key("cancel-pending")
        assert await store.release(await _own(store, key), error="boom")
        job = await store.cancel(key, "not needed any more")
        assert job is not None and job.status is Status.CANCELLED
        assert job.last_error == "not needed any more"
        outcome = await store.acquire(key, "B", ttl=5, max_no_progress=5)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.CANCELLED

    async def test_cancel_fences_the_running_owner_out(self, store: LeaseStore) -> None:
        """Cancelling a RUNNING job refuses its owner's next renewal and rejects its commit."""
        key = _key("cancel-running")
        fence = await _own(store, key)
        cancelled = await store.cancel(key)
        assert cancelled is not None and cancelled.status is Status.CANCELLED
        renewal = await _renew(store, fence, 5)
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
        done, twice = _key("cancel-done"), _key("cancel-twice")
        await store.commit(await _own(store, done), "r")
        job = await store.cancel(done)
        assert job is not None and job.status is Status.DONE and job.result == "r"
        await _own(store, twice)
        first = await store.cancel(twice, "first reason")
        again = await store.cancel(twice, "second reason")
        assert first is not None and again is not None
        assert again.status is Status.CANCELLED and again.last_error == "first reason"
        assert await store.cancel(_key("cancel-unknown")) is None

    async def test_follower_wakes_on_cancel(self, store: LeaseStore) -> None:
        """A waiting follower returns the CANCELLED record soon after the cancel."""
        key = _key("cancel-wake")
        await _own(store, key)

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

    # -- following ----------------------------------------------------------------------------

    async def test_follower_wakes_on_done(self, store: LeaseStore) -> None:
        """A waiting follower returns the owner's result soon after the commit."""
        key = _key("wake")
        fence = await _own(store, key)

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
        key = _key("lapse-follow")
        old = await _own(store, key, "A", ttl=0.5)
        started = time.monotonic()
        outcome = await acquire_or_follow(
            store, key, "B", ttl=30, max_no_progress=5, poll_interval=5.0
        )
        assert isinstance(outcome, Acquired) and outcome.fence.token > old.token
        assert 0.3 < time.monotonic() - started < 2.0


class JobQueueContract:
    """The job queue every built-in store also keeps (``ai_lease.lease.base.JobQueue``)."""

    async def test_submit_records_pending_job_and_makes_it_due(self, store: Any) -> None:
        """A submitted job is PENDING with its spec, and due at once."""
        key = _key("submit")
        job = await store.submit(key, '{"key": "x"}', "fp1")
        assert job.status is Status.PENDING and job.spec == '{"key": "x"}'
        assert key in await store.due(1000)

    async def test_resubmit_same_payload_is_idempotent_other_payload_conflicts(
        self, store: Any
    ) -> None:
        """The same key and payload again returns the job; another payload is a conflict."""
        key = _key("resubmit")
        first = await store.submit(key, "{}", "fp1")
        again = await store.submit(key, "{}", "fp1")
        assert again.created_at == first.created_at
        with pytest.raises(JobConflict):
            await store.submit(key, '{"other": 1}', "fp2")

    async def test_reschedule_moves_and_removes(self, store: Any) -> None:
        """A key scheduled later is not due; a removed key is never due."""
        key, gone = _key("later"), _key("gone")
        job = await store.submit(key, "{}", "fp")
        await store.submit(gone, "{}", "fp")
        await store.reschedule(key, job.read_at + 60)
        await store.reschedule(gone, None)
        due = await store.due(1000)
        assert key not in due and gone not in due
        await store.reschedule(key, job.read_at - 1)
        assert key in await store.due(1000)

    async def test_recovery_looks_are_handed_out_apart(self, store: Any) -> None:
        """A due recover_at() look is in due_recoveries() (and due()); a later one is not;
        reschedule() replaces it, reschedule(None) drops it from both."""
        orphan, later = _key("orphan"), _key("recover-later")
        job = await store.submit(orphan, "{}", "fp")
        await store.submit(later, "{}", "fp")
        await store.recover_at(orphan, job.read_at - 1)
        await store.recover_at(later, job.read_at + 3600)
        recoveries = await store.due_recoveries(1000)
        assert orphan in recoveries and later not in recoveries
        assert orphan in await store.due(1000)
        await store.reschedule(orphan, job.read_at - 1)  # a plain look replaces the recovery
        assert orphan not in await store.due_recoveries(1000)
        assert orphan in await store.due(1000)
        await store.recover_at(orphan, job.read_at - 1)
        await store.reschedule(orphan, None)
        assert orphan not in await store.due_recoveries(1000)
        assert orphan not in await store.due(1000)

    async def test_due_is_bounded_by_limit(self, store: Any) -> None:
        """due() returns at most ``limit`` keys, the longest-due first."""
        keys = [_key(f"limit{i}") for i in range(5)]
        for key in keys:
            await store.submit(key, "{}", "fp")
        assert len(await store.due(3)) == 3

    async def test_acquire_after_submit_keeps_the_spec(self, store: Any) -> None:
        """Running a submitted job keeps its spec and fingerprint; a done job stays done."""
        key = _key("run-submitted")
        await store.submit(key, '{"k": 1}', "fp")
        fence = await _own(store, key, fingerprint="fp")
        await store.commit(fence, "r")
        done = await store.get(key)  # acquire/commit answers may leave the big fields out
        assert done is not None and done.spec == '{"k": 1}' and done.fingerprint == "fp"
        again = await store.submit(key, '{"k": 1}', "fp")
        assert again.status is Status.DONE and again.result == "r"

    async def test_workers_are_listed_until_gone_or_expired(self, store: Any) -> None:
        """A beating worker is listed; it disappears when gone or when its beat expires."""
        from ai_lease.lease.base import WorkerInfo

        alive = WorkerInfo(_key("w1"), "host", 1, 2, 4, 0.0, 0.0)
        brief = WorkerInfo(_key("w2"), "host", 2, 0, 4, 0.0, 0.0)
        await store.worker_beat(alive, 30)
        await store.worker_beat(brief, 0.2)
        listed = {w.worker_id: w for w in await store.list_workers()}
        assert alive.worker_id in listed and listed[alive.worker_id].running == 2
        await asyncio.sleep(0.4)
        ids = {w.worker_id for w in await store.list_workers()}
        assert alive.worker_id in ids and brief.worker_id not in ids
        await store.worker_gone(alive.worker_id)
        assert alive.worker_id not in {w.worker_id for w in await store.list_workers()}


class DurationHistoryContract:
    """Duration histograms kept by the store (``ai_lease.observe.history.DurationHistory``)."""

    async def test_durations_add_up_across_writers(self, store: Any) -> None:
        """Counts added by several nodes for one series are summed; series stay apart."""
        series = ("default", "stage", _key("stage"))
        other = ("default", "first_token", "call_ai")
        await store.add_durations({series: {3: 2, 10: 1}})
        await store.add_durations({series: {3: 5}, other: {1: 1}})
        loaded = await store.load_durations()
        assert loaded[series] == {3: 7, 10: 1}
        assert loaded[other][1] >= 1
