"""Failover to a synchronous standby loses no acknowledged result and breaks no fence.

A primary and a streaming standby of our own (tests/harness/pg_pair.py): ``synchronous_commit
= on`` with ``synchronous_standby_names = '*'``, fsync on. A result committed through the
store is acknowledged only once the standby has its WAL; the primary is then SIGKILLed and
the standby promoted (``pg_ctl promote``). Against the promoted standby: the result is there,
fresh tokens are above every token handed out before (the token sequence is WAL-logged, and
a sequence's promoted value only ever jumps ahead, never back), and the old owner of a
still-running job is fenced out once someone else takes it over.

The whole module takes a few seconds (two clusters, one pg_basebackup), so it runs in the
default suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from ai_lease.errors import FencingRejected
from ai_lease.job import Status
from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired, Fence, Finished
from ai_lease.stores import open_store
from tests.harness.pg_pair import SyncPair

pytestmark = pytest.mark.postgres

TTL = 1.0  # the stale owner's lease: short, so the takeover on the new primary is quick


@pytest.fixture
def pair() -> Iterator[SyncPair]:
    with SyncPair() as running:
        yield running


async def _own(store: LeaseStore, key: str, owner: str, ttl: float = 30.0) -> Fence:
    outcome = await store.acquire(key, owner, ttl=ttl, max_no_progress=30.0)
    assert isinstance(outcome, Acquired), outcome
    return outcome.fence


def test_an_acknowledged_commit_is_on_the_promoted_standby(pair: SyncPair) -> None:
    """The harness itself: a row whose COMMIT returned is on the standby after failover."""
    assert pair.primary.execute("SHOW synchronous_standby_names") == [("*",)]
    pair.primary.execute("CREATE TABLE acked (v int)")
    pair.primary.execute("INSERT INTO acked VALUES (1)")
    pair.fail_over()
    assert pair.standby.execute("SELECT pg_is_in_recovery()") == [(False,)]
    assert pair.standby.execute("SELECT v FROM acked") == [(1,)]


async def test_failover_keeps_the_result_the_tokens_and_the_fence(pair: SyncPair) -> None:
    """Commit a result, kill the primary, promote the standby, reconnect: the result is
    there, new tokens are above the old ones, and the stale owner's write is fenced."""
    old = open_store(pair.primary.url, op_timeout=2.0)
    try:
        done = await _own(old, "done", "owner-a")
        committed = await old.commit(done, "the acknowledged answer")
        assert committed.status is Status.DONE
        stale = await _own(old, "held", "stale-owner", ttl=TTL)
        pair.fail_over()
    finally:
        await asyncio.wait_for(old.aclose(), 10)

    new = open_store(pair.standby.url, op_timeout=2.0)
    try:
        record = await new.get("done")
        assert record is not None and record.status is Status.DONE
        assert record.result == "the acknowledged answer" and record.token == done.token
        again = await new.acquire("done", "owner-b", ttl=30.0, max_no_progress=30.0)
        assert isinstance(again, Finished) and again.job.result == "the acknowledged answer"

        fresh = await _own(new, "fresh", "owner-b")
        assert fresh.token > max(done.token, stale.token), (fresh, done, stale)
        await asyncio.sleep(TTL + 0.3)  # the stale owner's lease lapses on the new primary
        taken = await _own(new, "held", "owner-b")
        assert taken.token > stale.token
        with pytest.raises(FencingRejected) as info:
            await new.commit(stale, "a late write from the old primary's era")
        assert info.value.current == taken
        held = await new.get("held")
        assert held is not None and held.status is Status.RUNNING and held.result is None
    finally:
        await new.aclose()
