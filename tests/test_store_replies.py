"""The record a lease operation answers with is the record the store then holds.

The Redis scripts answer lean (a new record's written fields, a commit's values in a fixed
order, no input and no result sent back): whatever they leave out or rebuild must still
decode to what a fresh ``get`` reads. Both stores, every path that answers with a record.
"""

import asyncio
import dataclasses
from typing import Any

from ai_lease.job import JobState
from ai_lease.lease import Acquired, Finished

REAL_TIME = "real stores: a lease lapses on the store's own clock"


ARGS: dict[str, Any] = {"ttl": 30.0, "max_no_progress": 5.0, "fingerprint": "fp-1"}
RENEW: dict[str, Any] = {"ttl": 30.0, "stage": "call_ai", "max_no_progress": 9.0, "grace": 1.0}


async def same_as_stored(store: Any, answered: JobState) -> None:
    stored = await store.get(answered.key)
    assert stored is not None
    assert dataclasses.replace(answered, read_at=0) == dataclasses.replace(stored, read_at=0)


async def test_a_new_records_acquire_answers_the_stored_record(store: Any) -> None:
    won = await store.acquire("fresh", "owner-a", max_attempts=3, **ARGS)
    assert isinstance(won, Acquired) and won.job.token > 0 and won.job.started_at is not None
    await same_as_stored(store, won.job)


async def test_a_commit_after_renewals_answers_the_stored_record(store: Any) -> None:
    won = await store.acquire("renewed", "owner-a", **ARGS)
    assert isinstance(won, Acquired)
    assert (await store.renew(won.fence, progress_version=2, **RENEW)).ok
    done = await store.commit(won.fence, '{"answer": 42}', finish_reason="stop")
    assert done.result == '{"answer": 42}' and done.finish_reason == "stop"
    assert done.progress_version == 2 and done.stage == "done"
    await same_as_stored(store, done)
    again = await store.commit(won.fence, '{"answer": 42}')  # a resent commit
    await same_as_stored(store, again)


async def test_a_failure_answers_the_stored_record(store: Any) -> None:
    won = await store.acquire("failing", "owner-a", **ARGS)
    assert isinstance(won, Acquired)
    failed = await store.fail(won.fence, "bad input")
    assert failed.last_error == "bad input"
    await same_as_stored(store, failed)


async def test_a_takeover_answers_the_stored_record(store: Any) -> None:
    first = await store.acquire("taken", "owner-a", **(ARGS | {"ttl": 0.2}))
    assert isinstance(first, Acquired)
    await store.renew(first.fence, progress_version=1, **(RENEW | {"ttl": 0.2}))
    await store.release(first.fence, error="provider timed out")
    await asyncio.sleep(0.01)
    second = await store.acquire("taken", "owner-b", **ARGS)
    assert isinstance(second, Acquired) and second.job.attempts == 2
    assert second.job.last_error == "provider timed out" and second.job.progress_version == 0
    await same_as_stored(store, second.job)
    gave_up = await store.acquire("given-up", "owner-a", max_attempts=0, **ARGS)
    assert isinstance(gave_up, Finished)
    await same_as_stored(store, gave_up.job)
