"""The job timeline, store by store: where it lives, what an entry holds, what it costs.

The behaviour both stores share is the contract (ai_lease/testing/contract_timeline.py, run in
tests/test_store_contract.py and tests/test_redis_cluster.py); these look underneath it."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from ai_lease.lease import Acquired
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite import timeline as sqlite_timeline
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.redis_server import RedisServer


@pytest.fixture
async def rstore(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    redis_server.flushall()
    store = RedisStore.from_url(redis_server.url, op_timeout=2.0)
    yield store
    await store.aclose()


async def _short_job(store: Any, key: str) -> None:
    won = await store.acquire(key, "node-a#1", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    await store.commit(won.fence, '"r"')


async def test_a_short_job_still_makes_two_round_trips(rstore: RedisStore) -> None:
    """The entries are written inside ACQUIRE and FINISH: no command of their own."""
    await _short_job(rstore, "warm")  # the scripts loaded, the connections open
    sent: list[str] = []
    execute = rstore._client.execute_command

    async def counted(*args: Any, **kw: Any) -> Any:
        sent.append(str(args[0]))
        return await execute(*args, **kw)

    rstore._client.execute_command = counted
    await _short_job(rstore, "job")
    assert sent == ["EVALSHA", "EVALSHA"]
    entries, _ = await rstore.timeline("job")
    assert [e.kind for e in entries] == ["acquired", "committed"]


async def test_redis_timeline_is_a_capped_list_in_the_jobs_slot(
    rstore: RedisStore, redis_server: RedisServer
) -> None:
    """``<ns>:{<tag>}:timeline``, beside the hash; an entry is seven tab-separated fields,
    one line, the text bounded."""
    job, _, line = rstore.keys("a{b}c")
    assert line.endswith(":timeline") and len({key_slot(k.encode()) for k in (job, line)}) == 1
    won = await rstore.acquire("a{b}c", "node-a#1", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    await rstore.fail(won.fence, "x\ty" + "z" * 500 + "\nsecond line")
    client = redis.Redis.from_url(redis_server.url)
    raw = client.lrange(line, 0, -1)
    fields = raw[-1].decode().split("\t")
    assert len(fields) == 7 and fields[2] == "failed" and fields[6] == ("x y" + "z" * 500)[:200]
    await rstore.cancel("a{b}c")  # ended already: nothing noted
    assert len(client.lrange(line, 0, -1)) == 2
    client.close()


async def test_sqlite_timeline_table_and_its_index(tmp_path: Path) -> None:
    """``ai_lease_timeline`` keyed by (key, seq); an old file opened read-only without it
    (a read-only open of a file from before timelines) reads as an empty timeline."""
    store = SQLiteStore(tmp_path / "new.db")
    try:
        await _short_job(store, "job")
    finally:
        await store.aclose()
    conn = sqlite3.connect(tmp_path / "new.db")
    rows = conn.execute("SELECT key, seq, kind FROM ai_lease_timeline ORDER BY seq").fetchall()
    pk = [r[1] for r in conn.execute("PRAGMA table_info(ai_lease_timeline)") if r[5]]
    conn.close()
    assert rows == [("job", 1, "acquired"), ("job", 2, "committed")] and pk == ["key", "seq"]

    old = sqlite3.connect(tmp_path / "old.db")  # as a read-only open of an old file sees it
    old.execute("CREATE TABLE ai_lease_jobs (key TEXT PRIMARY KEY, status TEXT, record BLOB)")
    assert sqlite_timeline.read(old, "job", 0, 200) == ([], 0)
    old.close()
