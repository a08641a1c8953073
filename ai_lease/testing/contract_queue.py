"""The job-queue and duration-history contracts: what a store with a queue promises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.job import Status
from ai_lease.lease.base import Acquired, Fence
from ai_lease.lease.queue import look_at, unschedules_ended
from ai_lease.testing.contract_support import key_for, own, renew


class JobQueueContract:
    """The job queue every built-in store also keeps (``ai_lease.lease.queue.JobQueue``)."""

    async def test_submit_records_pending_job_and_makes_it_due(self, store: Any) -> None:
        """A submitted job is PENDING with its spec, and due at once."""
        key = key_for("submit")
        job = await store.submit(key, '{"key": "x"}', "fp1")
        assert job.status is Status.PENDING and job.spec == '{"key": "x"}'
        assert key in await store.due(1000)

    async def test_resubmit_same_payload_is_idempotent_other_payload_conflicts(
        self, store: Any
    ) -> None:
        """The same key and payload again returns the job; another payload is a conflict."""
        key = key_for("resubmit")
        first = await store.submit(key, "{}", "fp1")
        again = await store.submit(key, "{}", "fp1")
        assert again.created_at == first.created_at
        with pytest.raises(JobConflict):
            await store.submit(key, '{"other": 1}', "fp2")

    async def test_reschedule_moves_and_removes(self, store: Any) -> None:
        """A key scheduled later is not due; a removed key is never due."""
        key, gone = key_for("later"), key_for("gone")
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
        orphan, later = key_for("orphan"), key_for("recover-later")
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

    async def test_a_workers_look_moves_the_entry_by_what_it_read(self, store: Any) -> None:
        """look_at() returns the record and moves its queue entry by next_look(): a job to
        run ``ttl`` on (a recovery look), a live owner's job to its lease expiry, an ended
        or unknown job off the schedule (whether the store looks in one call or two)."""
        soon, later, held, ended = (key_for(f"look-{n}") for n in ("soon", "later", "held", "end"))
        for key in (soon, later, held, ended):
            await store.submit(key, "{}", "fp")
        job = await look_at(store, soon, -1.0)  # to run, its own lease "lapsed" already
        assert job is not None and job.status is Status.PENDING and job.spec == "{}"
        assert soon in await store.due_recoveries(1000) and soon in await store.due(1000)
        assert (await look_at(store, later, 60.0)) is not None
        assert later not in await store.due(1000)
        assert later not in await store.due_recoveries(1000)
        fence = await own(store, held, ttl=30.0)
        await store.reschedule(held, job.read_at - 1)  # due again: a look will move it
        running = await look_at(store, held, -1.0)  # the live lease wins over ttl
        assert running is not None and running.status is Status.RUNNING
        assert running.owner_id == fence.owner_id
        assert held not in await store.due(1000)
        assert held not in await store.due_recoveries(1000)
        await store.commit(await own(store, ended), "r")
        await store.recover_at(ended, job.read_at - 1)  # due again, as after a lost reply
        done = await look_at(store, ended, -1.0)
        assert done is not None and done.status is Status.DONE
        assert ended not in await store.due(1000)
        assert ended not in await store.due_recoveries(1000)
        unknown = key_for("look-unknown")
        await store.recover_at(unknown, job.read_at - 1)
        assert await look_at(store, unknown, -1.0) is None
        assert unknown not in await store.due(1000)
        assert unknown not in await store.due_recoveries(1000)

    async def test_an_owners_end_takes_the_job_off_the_schedule(self, store: Any) -> None:
        """A store that says it does (``unschedules_ended``): a commit or a fail takes the
        job out of the queue and the recovery looks in the same write; a refused one does
        not. One that does not leaves them to the worker's ``reschedule(key, None)``."""
        committed, failed = key_for("end-commit"), key_for("end-fail")
        for key in (committed, failed):
            job = await store.submit(key, "{}", "fp")
            await store.recover_at(key, job.read_at - 1)
        done, broken = await own(store, committed), await own(store, failed)
        await store.commit(done, "r")
        await store.fail(broken, "broken")
        if not unschedules_ended(store):
            assert {committed, failed} <= set(await store.due_recoveries(1000))
            for key in (committed, failed):
                await store.reschedule(key, None)
        due, recoveries = await store.due(1000), await store.due_recoveries(1000)
        for key in (committed, failed):
            assert key not in due and key not in recoveries
        await store.recover_at(committed, job.read_at - 1)  # a repeat changes nothing
        with pytest.raises(FencingRejected):
            await store.commit(Fence(committed, done.owner_id, done.token + 1), "other")
        assert committed in await store.due_recoveries(1000)

    async def test_due_is_bounded_by_limit(self, store: Any) -> None:
        """due() returns at most ``limit`` keys, the longest-due first."""
        keys = [key_for(f"limit{i}") for i in range(5)]
        for key in keys:
            await store.submit(key, "{}", "fp")
        assert len(await store.due(3)) == 3

    async def test_acquire_after_submit_keeps_the_spec(self, store: Any) -> None:
        """Running a submitted job keeps its spec and fingerprint; a done job stays done."""
        key = key_for("run-submitted")
        await store.submit(key, '{"k": 1}', "fp")
        fence = await own(store, key, fingerprint="fp")
        await store.commit(fence, "r")
        done = await store.get(key)  # acquire/commit answers may leave the big fields out
        assert done is not None and done.spec == '{"k": 1}' and done.fingerprint == "fp"
        again = await store.submit(key, '{"k": 1}', "fp")
        assert again.status is Status.DONE and again.result == "r"

    async def test_workers_are_listed_until_gone_or_expired(self, store: Any) -> None:
        """A beating worker is listed; it disappears when gone or when its beat expires."""
        from ai_lease.lease.queue import WorkerInfo

        alive = WorkerInfo(key_for("w1"), "host", 1, 2, 4, 0.0, 0.0)
        brief = WorkerInfo(key_for("w2"), "host", 2, 0, 4, 0.0, 0.0)
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
        series = ("default", "stage", key_for("stage"))
        other = ("default", "first_token", "call_ai")
        await store.add_durations({series: {3: 2, 10: 1}})
        await store.add_durations({series: {3: 5}, other: {1: 1}})
        loaded = await store.load_durations()
        assert loaded[series] == {3: 7, 10: 1}
        assert loaded[other][1] >= 1


def _same(a: Any, b: Any) -> bool:
    """Two reads of one record, apart from when they were read."""
    return bool(a.to_dict() | {"read_at": 0} == b.to_dict() | {"read_at": 0})


class JobAdminContract:
    """retry, remove and prune (``ai_lease.lease.admin.JobAdmin``): each one atomic step."""

    async def test_retry_sends_a_failed_job_back_with_a_fresh_budget(self, store: Any) -> None:
        """A FAILED job is PENDING again with attempts 0 and due at once; the next acquire
        is its first attempt (no takeover) under a higher token."""
        key = key_for("retry-failed")
        await store.submit(key, "{}", "fp")
        fence = await own(store, key)
        await store.reschedule(key, None)
        await store.fail(fence, "broken")
        job = await store.retry(key)
        assert job is not None and job.status is Status.PENDING and job.attempts == 0
        assert job.owner_id is None and job.lease_expires_at is None
        assert key in await store.due(1000)
        again = await store.acquire(key, "B", ttl=30, max_no_progress=30)
        assert isinstance(again, Acquired) and not again.takeover
        assert again.job.attempts == 1 and again.fence.token > fence.token

    async def test_retry_of_a_cancelled_job_keeps_its_old_owner_out(self, store: Any) -> None:
        """A job cancelled while running, then retried: the old owner's commit and renewal
        are still refused."""
        key = key_for("retry-cancelled")
        fence = await own(store, key)
        await store.cancel(key, "stop")
        job = await store.retry(key)
        assert job is not None and job.status is Status.PENDING
        with pytest.raises(FencingRejected):
            await store.commit(fence, "zombie")
        assert not (await renew(store, fence, 5)).ok
        stored = await store.get(key)
        assert stored is not None and stored.status is Status.PENDING and stored.result is None

    async def test_retry_leaves_other_jobs_as_they_are(self, store: Any) -> None:
        """RUNNING, PENDING and DONE jobs come back unchanged; an unknown key gives None."""
        running, pending, done = key_for("r-run"), key_for("r-pend"), key_for("r-done")
        await own(store, running)
        await store.submit(pending, "{}", "fp")
        await store.commit(await own(store, done), "r")
        for key in (running, pending, done):
            before = await store.get(key)
            assert _same(await store.retry(key), before) and _same(await store.get(key), before)
        assert await store.retry(key_for("r-unknown")) is None

    async def test_remove_deletes_the_job_and_its_entries(self, store: Any) -> None:
        """A removed job is gone from the records, the queue and the recovery looks."""
        key = key_for("rm")
        await store.submit(key, "{}", "fp")
        await store.recover_at(key, 0.0)
        removal = await store.remove(key)
        assert removal.removed and removal.job is not None and removal.job.key == key
        assert await store.get(key) is None
        assert key not in await store.due(1000) and key not in await store.due_recoveries(1000)
        gone = await store.remove(key)
        assert not gone.removed and gone.job is None

    async def test_remove_keeps_a_live_job_unless_forced(self, store: Any) -> None:
        """A RUNNING job under a live lease is kept (unchanged) unless forced; forced, its
        owner's renewal and commit are refused (no record)."""
        key = key_for("rm-live")
        fence = await own(store, key, ttl=1.0)
        before = await store.get(key)
        kept = await store.remove(key)
        assert not kept.removed and _same(kept.job, before) and _same(await store.get(key), before)
        forced = await store.remove(key, force=True)
        assert forced.removed and await store.get(key) is None
        assert not (await renew(store, fence, 5)).ok
        with pytest.raises(FencingRejected):
            await store.commit(fence, "zombie")
        await asyncio.sleep(1.2)  # past the lease it had: no lapsed lease is left to find
        assert key not in await store.due(1000)

    async def test_prune_removes_old_terminal_jobs_only(self, store: Any) -> None:
        """prune removes the jobs of the given terminal statuses last written before the
        cut-off; newer, running and pending ones stay."""
        old = {s: key_for(f"old-{s}") for s in ("DONE", "FAILED", "CANCELLED")}
        await store.commit(await own(store, old["DONE"]), "r")
        await store.fail(await own(store, old["FAILED"]), "broken")
        await own(store, old["CANCELLED"])
        await store.cancel(old["CANCELLED"])
        await store.submit(pending := key_for("old-pending"), "{}", "fp")
        await own(store, running := key_for("old-running"))
        await asyncio.sleep(1.5)
        await store.commit(await own(store, new := key_for("new-done")), "r")
        assert await store.prune(0.75, frozenset()) == 0  # no status: nothing
        # At least: a store shared with other jobs may hold more old ones.
        assert await store.prune(0.75, frozenset({"FAILED"})) >= 1
        assert await store.get(old["FAILED"]) is None and await store.get(old["DONE"])
        assert await store.prune(0.75) >= 2
        for key in (pending, running, new):
            assert await store.get(key) is not None, key
        assert await store.get(old["DONE"]) is None and await store.get(old["CANCELLED"]) is None
