"""What one job costs the Redis server, and the bookkeeping that keeps it low.

The job scripts read and write the record once each; the timeline's numbering and the
creation index's membership ride on those reads and writes (``timeline_seq``, ``indexed``),
and PENDING is the rest of the creation index rather than a counter. These pin the cost, and
that records and counts left by an older ai-lease (without that bookkeeping) still read right.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from ai_lease.lease import Acquired
from ai_lease.stores.redis.store import RedisStore
from tests.harness.redis_server import RedisServer

SPEC = '{"key": "k", "input": "x"}'


@pytest.fixture
async def rstore(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=2.0)
    yield store
    await store.aclose()


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


def _calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in stats.items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }


async def _acquire(store: RedisStore, key: str, owner: str = "node-a#1") -> Acquired:
    won = await store.acquire(key, owner, ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    return won


async def test_a_queued_job_costs_4_round_trips_and_at_most_26_commands(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    """What a worker's job sends: submit, the worker's look (the record, and its queue entry
    moved to when the lease could lapse), acquire, commit (which also takes the job off the
    queue): 4 round trips and at most 26 commands inside them (32 for submit + acquire +
    commit alone before the record carried its own bookkeeping; 6 round trips and 27
    commands when the worker read, moved and unqueued the job apart), none of them a
    timeline or an index look-up."""
    await rstore.submit("warm", SPEC, "fp")  # scripts loaded, connections open
    raw.config_resetstat()
    await rstore.submit("job", SPEC, "fp")
    looked = await rstore.look("job", 30.0)
    assert looked is not None and looked.spec == SPEC
    won = await _acquire(rstore, "job")
    await rstore.commit(won.fence, '"r"')
    calls = _calls(raw)
    assert calls.pop("evalsha") == 4
    assert not {"lindex", "zscore", "exists", "hget", "hdel"} & calls.keys(), calls
    assert sum(calls.values()) <= 26, sorted(calls.items())
    assert not raw.zscore(rstore._calls._queue, "job")  # off the schedule
    assert not raw.zscore(rstore._calls._recovery, "job")


async def test_timeline_numbering_follows_entries_another_writer_added(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    """An entry pushed without the record's count (an older ai-lease) and a record without
    the count at all: the next entries still number on from the list's last one."""
    won = await _acquire(rstore, "job")
    job, _, line = rstore.keys("job")
    raw.rpush(line, "2\t1\tcancelled\tnode-b#1\t1\t\tan older writer")
    await rstore.note("job", "model_call", "first", owner_id="node-a#1", token=won.fence.token)
    raw.hdel(job, "timeline_seq")
    await rstore.commit(won.fence, '"r"')
    entries, dropped = await rstore.timeline("job")
    assert [(e.seq, e.kind) for e in entries] == [
        (1, "acquired"),
        (2, "cancelled"),
        (3, "model_call"),
        (4, "committed"),
    ]
    assert dropped == 0


async def test_counts_read_right_beside_an_older_ai_leases_bookkeeping(
    rstore: RedisStore, raw: redis.Redis
) -> None:
    """A stale PENDING counter is ignored (PENDING is the rest of the index), and a record
    without its ``indexed`` mark still moves its count when its status moves."""
    for key in ("a", "b", "c"):
        await rstore.submit(key, SPEC, "fp")
    assert await rstore.count_jobs() == {"PENDING": 3}
    counts = rstore._calls._counts
    raw.zincrby(counts, 40, "PENDING")  # as an older ai-lease may have left it
    raw.hdel(rstore.keys("a")[0], "indexed")  # a record from before the mark
    won = await _acquire(rstore, "a")
    assert await rstore.count_jobs() == {"PENDING": 2, "RUNNING": 1}
    await rstore.commit(won.fence, '"r"')
    await rstore.cancel("b")
    assert await rstore.count_jobs() == {"PENDING": 1, "DONE": 1, "CANCELLED": 1}
    await rstore.remove("c")
    assert await rstore.count_jobs() == {"DONE": 1, "CANCELLED": 1}
