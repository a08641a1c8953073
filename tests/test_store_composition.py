"""Each store is one object composed of parts that share its one connection (issue 27).

No I/O: a store is built, looked at and closed; the contract suite checks what the parts do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import JobListing, LeaseStore
from ai_lease.lease.histogram import DurationHistory
from ai_lease.lease.queue import GaugedStore, JobQueue
from ai_lease.lease.slots import SlotStore
from ai_lease.lease.timeline import JobNotes, JobTimeline
from ai_lease.stores.postgres.conn import PostgresConn
from ai_lease.stores.postgres.store import PostgresStore
from ai_lease.stores.redis.calls import RedisCalls
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.file import SQLiteFile
from ai_lease.stores.sqlite.store import SQLiteStore

PARTS = {  # a part's name on the store: the protocols it implements, the methods bound
    "queue": (
        (JobQueue, GaugedStore, DurationHistory),
        "submit due reschedule recover_at due_recoveries worker_beat worker_gone list_workers"
        " gauges add_durations load_durations".split(),
    ),
    "admin": ((JobAdmin,), ["retry", "remove", "prune"]),
    "listing": ((JobListing,), ["list_page", "count_jobs"]),
    "notes": ((JobTimeline, JobNotes), ["timeline", "note"]),
    "slots": (
        (SlotStore,),
        "acquire_slot renew_slot release_slot leave_slot slot_state wait_slot pause_slot"
        " reweigh_slot".split(),
    ),
}


def _sqlite(tmp_path: Path) -> tuple[Any, str, type]:
    return SQLiteStore(tmp_path / "c.db"), "_file", SQLiteFile


def _redis(tmp_path: Path) -> tuple[Any, str, type]:
    return RedisStore(redis.asyncio.Redis(), namespace="ns"), "_calls", RedisCalls


def _postgres(tmp_path: Path) -> tuple[Any, str, type]:
    return PostgresStore.from_url("postgresql://app@127.0.0.1:1/jobs"), "_conn", PostgresConn


@pytest.mark.parametrize("make", [_sqlite, _redis, _postgres], ids=["sqlite", "redis", "pg"])
async def test_a_store_is_composed_of_parts_sharing_one_connection(
    make: Any, tmp_path: Path
) -> None:
    """Every part is a small class of its own (no base class) holding the store's one
    connection object, and the store's methods for it are the part's own."""
    store, attribute, connection_type = make(tmp_path)
    try:
        connection = getattr(store, attribute)
        assert isinstance(connection, connection_type)
        assert isinstance(store, LeaseStore)
        assert not isinstance(store, connection_type), "the store holds its connection"
        for name, (protocols, methods) in PARTS.items():
            part = getattr(store, name)
            assert type(part).__mro__ == (type(part), object), name
            assert getattr(part, attribute) is connection, name
            for protocol in protocols:
                assert isinstance(part, protocol) and isinstance(store, protocol), protocol
            for method in methods:
                assert getattr(store, method) == getattr(part, method), method
    finally:
        await store.aclose()
