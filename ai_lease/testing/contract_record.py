"""The lease-store contract's record: attempts apart from takeovers, health, what ran.

Part of :class:`~ai_lease.testing.contract.LeaseStoreContract`, which every store passes.
Owner ids are ``<node_id>#<n>.<random>`` (:func:`ai_lease.lease.fence.new_owner_id`): two
owners of one node are the same node retrying, not a takeover.
"""

from __future__ import annotations

import asyncio

from ai_lease.job import Health, RunFacts, Status
from ai_lease.lease.base import Acquired, LeaseStore
from ai_lease.testing.contract_support import key_for, own, renew


async def _taken(store: LeaseStore, key: str, owner: str) -> Acquired:
    outcome = await store.acquire(key, owner, ttl=30, max_no_progress=30)
    assert isinstance(outcome, Acquired), outcome
    return outcome


class RecordContract:
    """What the record says about who ran a job and how (DESIGN.md, Health); a mixin of
    :class:`~ai_lease.testing.contract.LeaseStoreContract`."""

    # -- attempts and takeovers ----------------------------------------------------------------

    async def test_same_node_retry_is_an_attempt_not_a_takeover(self, store: LeaseStore) -> None:
        """The same node acquiring again (a retry after a 429) counts an attempt only."""
        key = key_for("retry")
        first = await own(store, key, "api-1#1.aa")
        assert await store.release(first, error="429 Too Many Requests")
        again = await _taken(store, key, "api-1#2.bb")
        assert not again.takeover and again.cause is None
        job = await store.get(key)
        assert job is not None and job.attempts == 2 and job.takeovers == 0
        assert job.takeover_cause is None

    async def test_other_node_after_lapse_is_an_expired_takeover(self, store: LeaseStore) -> None:
        """Another node acquiring after the lease lapsed: a takeover, cause ``expired``."""
        key = key_for("expired")
        await own(store, key, "api-1#1.aa", ttl=0.3)
        await asyncio.sleep(0.5)
        taken = await _taken(store, key, "api-2#1.cc")
        assert taken.takeover and taken.cause == "expired"
        job = await store.get(key)
        assert job is not None and (job.attempts, job.takeovers) == (2, 1)
        assert job.takeover_cause == "expired"

    async def test_other_node_after_release_is_a_released_takeover(self, store: LeaseStore) -> None:
        """Another node acquiring a released job: a takeover, cause ``released``."""
        key = key_for("released")
        first = await own(store, key, "api-1#1.aa")
        assert await store.release(first, error="stepping down")
        taken = await _taken(store, key, "api-2#1.cc")
        assert taken.takeover and taken.cause == "released"
        assert taken.job.takeovers == 1 and taken.job.takeover_cause == "released"

    async def test_other_node_after_a_reported_stall_is_a_stalled_takeover(
        self, store: LeaseStore
    ) -> None:
        """A stall reported, then the lease lapses: the takeover's cause is ``stalled``."""
        key = key_for("stalled")
        first = await own(store, key, "api-1#1.aa", ttl=0.3)
        assert await store.report_stall(first, "call_ai", "stuck in call_ai\nframes...")
        await asyncio.sleep(0.5)
        taken = await _taken(store, key, "api-2#1.cc")
        assert taken.takeover and taken.cause == "stalled"
        job = await store.get(key)
        assert job is not None and job.takeover_cause == "stalled" and job.takeovers == 1

    async def test_release_with_a_stall_snapshot_is_a_stalled_takeover(
        self, store: LeaseStore
    ) -> None:
        """A release carrying a stall snapshot: the next node's takeover is ``stalled``."""
        key = key_for("stall-release")
        first = await own(store, key, "api-1#1.aa")
        assert await store.release(first, error="no progress", snapshot="stuck in parse")
        taken = await _taken(store, key, "api-2#1.cc")
        assert taken.takeover and taken.cause == "stalled"

    async def test_refused_renewal_for_no_progress_marks_a_stall(self, store: LeaseStore) -> None:
        """The store refusing a renewal for no progress marks the attempt stalled."""
        key = key_for("stall-renew")
        first = await own(store, key, "api-1#1.aa", ttl=0.6, mnp=0.05)
        await asyncio.sleep(0.15)
        answer = await renew(store, first, 0, mnp=0.05, ttl=0.6)
        assert not answer.ok
        await asyncio.sleep(0.6)
        taken = await _taken(store, key, "api-2#1.cc")
        assert taken.cause == "stalled"

    async def test_a_stall_of_an_earlier_attempt_is_not_the_cause(self, store: LeaseStore) -> None:
        """A stall two attempts back does not colour a later, plain release."""
        key = key_for("old-stall")
        first = await own(store, key, "api-1#1.aa")
        assert await store.release(first, error="x", snapshot="stuck")
        second = (await _taken(store, key, "api-2#1.cc")).fence
        assert await store.release(second, error="429")
        third = await _taken(store, key, "api-3#1.dd")
        assert third.cause == "released" and third.job.takeovers == 2

    # -- health ---------------------------------------------------------------------------------

    async def test_record_carries_the_renew_interval(self, store: LeaseStore) -> None:
        """Acquire writes the owner's renew interval; renew writes the one in force."""
        key = key_for("interval")
        fence = await own(store, key, "api-1#1.aa", renew_interval=2.5)
        job = await store.get(key)
        assert job is not None and job.renew_interval == 2.5
        assert (await renew(store, fence, 1, grace=1.5)).ok
        job = await store.get(key)
        assert job is not None and job.renew_interval == 1.5

    async def test_silent_owner_is_node_lost_while_its_lease_runs(self, store: LeaseStore) -> None:
        """No renewal for longer than renew_interval + grace: ``node lost``, though the
        lease still has most of its TTL to run (never ``zombie``)."""
        key = key_for("silent")
        await own(store, key, "api-1#1.aa", ttl=30, renew_interval=0.1)
        job = await store.get(key)
        assert job is not None and job.health() is Health.HEALTHY
        await asyncio.sleep(0.35)
        job = await store.get(key)
        assert job is not None and job.lease_live and job.health() is Health.NODE_LOST

    # -- what ran -------------------------------------------------------------------------------

    async def test_commit_records_what_ran(self, store: LeaseStore) -> None:
        """Provider, model, tokens, first-token time, stage durations and finished_at are
        in the commit's answer and in the stored record."""
        key = key_for("facts")
        fence = await own(store, key, "api-1#1.aa")
        facts = RunFacts(
            provider="openai",
            model="gpt-x",
            prompt_tokens=12,
            completion_tokens=34,
            first_token_s=0.25,
            stage_durations={"load": 0.001, "call_ai": 1.5},
        )
        done = await store.commit(fence, '"ok"', facts=facts)
        stored = await store.get(key)
        for job in (done, stored):
            assert job is not None and job.status is Status.DONE
            assert (job.provider, job.model) == ("openai", "gpt-x")
            assert (job.prompt_tokens, job.completion_tokens) == (12, 34)
            assert job.first_token_s == 0.25
            assert job.durations == {"load": 0.001, "call_ai": 1.5}
            assert job.finished_at is not None and job.finished_at >= job.created_at
            assert job.to_dict()["stage_durations"] == {"load": 0.001, "call_ai": 1.5}
        again = await store.commit(fence, '"ok"', facts=facts)
        assert again.provider == "openai" and again.token == fence.token

    async def test_fail_records_what_ran_and_whose_error(self, store: LeaseStore) -> None:
        key = key_for("fail-facts")
        fence = await own(store, key, "api-1#1.aa")
        failed = await store.fail(fence, "bad input", facts=RunFacts(provider="anthropic"))
        assert failed.provider == "anthropic" and failed.finished_at is not None
        assert (failed.last_error_attempt, failed.last_error_owner) == (1, "api-1#1.aa")
        assert failed.prompt_tokens is None and failed.durations is None

    async def test_done_job_names_the_attempt_an_earlier_error_came_from(
        self, store: LeaseStore
    ) -> None:
        """An error left by attempt 1 on a job attempt 2 committed says where it came from."""
        key = key_for("error-origin")
        first = await own(store, key, "api-1#1.aa")
        assert await store.release(first, error="timeout reading the stream")
        second = (await _taken(store, key, "api-2#1.cc")).fence
        done = await store.commit(second, '"ok"')
        assert done.last_error == "timeout reading the stream"
        assert (done.last_error_attempt, done.last_error_owner) == (1, "api-1#1.aa")
        assert done.attempts == 2
        stall = await own(store, key_for("stall-origin"), "api-1#1.aa")
        assert await store.report_stall(stall, "parse", "stuck in parse")
        job = await store.get(stall.key)
        assert job is not None and (job.last_error_attempt, job.last_error_owner) == (
            1,
            "api-1#1.aa",
        )
