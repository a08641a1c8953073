"""The store contract for failures as codes: every store keeps a FAILED record's
``failure_kind`` and gives it back; a job out of attempts is ``gave_up``, its last error kept
and the sentence rendered when the record is read (:mod:`ai_lease.failure`)."""

from __future__ import annotations

import asyncio

import pytest

from ai_lease.failure import FailureKind
from ai_lease.job import Status
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import Finished, LeaseStore
from ai_lease.testing.contract_support import key_for, own


class FailureContract:
    """Mixed into :class:`~ai_lease.testing.contract.LeaseStoreContract`."""

    async def test_fail_keeps_the_kind_given(self, store: LeaseStore) -> None:
        """fail(kind=...) stores the kind; the answer and a later read both carry it."""
        key = key_for("kind")
        fence = await own(store, key)
        job = await store.fail(fence, "provider said 401", kind=FailureKind.PROVIDER_REFUSED)
        assert job.failure_kind == "provider_refused" and job.last_error == "provider said 401"
        read = await store.get(key)
        assert read is not None and read.failure_kind == "provider_refused"
        assert read.ended_by == "provider_refused"

    async def test_fail_without_a_kind_is_an_error(self, store: LeaseStore) -> None:
        """fail() with no kind stores the kind its reason names by its error class, else
        ``error``; a DONE record has no kind."""
        failed = await store.fail(await own(store, key_for("no-kind")), "it broke")
        assert failed.failure_kind == "error"
        named = await store.fail(await own(store, key_for("named")), "StreamIdleTimeout: 30s")
        assert named.failure_kind == "timed_out"
        key = key_for("done-kind")
        done = await store.commit(await own(store, key), '"ok"')
        assert done.failure_kind is None
        read = await store.get(key)
        assert read is not None and read.failure_kind is None

    async def test_out_of_attempts_is_gave_up(self, store: LeaseStore) -> None:
        """The acquire past the last attempt writes ``gave_up``; readers see the sentence
        with the last error, and ``ended_by`` names what ended the last attempt."""
        key = key_for("gave-up")
        fence = await own(store, key, max_attempts=1)
        await store.release(fence, error="FirstTokenTimeout: no first token in 0.3s")
        outcome = await store.acquire(key, "B", ttl=5, max_no_progress=5, max_attempts=1)
        assert isinstance(outcome, Finished) and outcome.job.status is Status.FAILED
        want = "gave up after 1 attempts: FirstTokenTimeout: no first token in 0.3s"
        for job in (outcome.job, await store.get(key)):
            assert job is not None and job.failure_kind == "gave_up"
            assert job.last_error == want and job.ended_by == "timed_out"

    async def test_out_of_attempts_with_no_error_says_its_lease_lapsed(
        self, store: LeaseStore
    ) -> None:
        """A job given up on with no error recorded reads "… attempts: lease lapsed"."""
        key = key_for("gave-up-lapsed")
        await own(store, key, ttl=0.2, max_attempts=1)
        await asyncio.sleep(0.4)
        outcome = await store.acquire(key, "B", ttl=5, max_no_progress=5, max_attempts=1)
        assert isinstance(outcome, Finished)
        job = await store.get(key)
        assert job is not None and job.failure_kind == "gave_up"
        assert job.last_error == "gave up after 1 attempts: lease lapsed"
        assert job.ended_by == "error"

    async def test_retry_clears_the_kind(self, store: LeaseStore) -> None:
        """A retried job is PENDING with no failure kind; its last error is the one the
        last attempt wrote, without the verdict."""
        if not isinstance(store, JobAdmin):
            pytest.skip("the store has no retry (JobAdmin)")
        key = key_for("retry-kind")
        await store.release(await own(store, key, max_attempts=1), error="B crashed")
        await store.acquire(key, "B", ttl=5, max_no_progress=5, max_attempts=1)
        again = await store.retry(key)
        assert again is not None and again.status is Status.PENDING
        assert again.failure_kind is None and again.last_error == "B crashed"
        read = await store.get(key)
        assert read is not None and read.failure_kind is None and read.last_error == "B crashed"
