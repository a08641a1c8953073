"""Provider slots on PostgreSQL (migrations 5, 6 and 7): a schema at migration 4 (no slot
tables or functions), 5 (no pauses) or 6 (no weights) is upgraded in place, its jobs and slots
kept, and then keeps slots, pauses and weighted slots; a slot freed wakes its waiters through
the store's one LISTEN connection, never a job's followers."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from ai_lease.lease import Acquired
from ai_lease.lease.slots import SlotGrant, SlotState, SlotWait
from ai_lease.stores.postgres.schema import VERSION
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer

pytestmark = pytest.mark.postgres

# What migrations 5 to 7 add, taken away again: the schema as migration 4 left it.
_BACK_TO_V4 = """
DROP FUNCTION {ns}.ail_slot_acquire, {ns}.ail_slot_renew, {ns}.ail_slot_release,
  {ns}.ail_slot_pause, {ns}.ail_slot_reweigh;
DROP TABLE {ns}.ail_slot_limits, {ns}.ail_slots, {ns}.ail_slot_waiters, {ns}.ail_slot_pauses;
DELETE FROM {ns}.ail_migrations WHERE version > 4;
INSERT INTO {ns}.ail_migrations VALUES (4, clock_timestamp()) ON CONFLICT DO NOTHING
"""


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_sl_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


def _store(pg_server: PostgresServer, namespace: str) -> PostgresStore:
    return PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=5.0)


async def test_a_schema_at_migration_4_is_upgraded_and_keeps_slots(
    pg_server: PostgresServer, namespace: str
) -> None:
    """The job written before the upgrade is still there; slots work after it."""
    store = _store(pg_server, namespace)
    try:
        assert isinstance(await store.acquire("old", "A", ttl=30, max_no_progress=30), Acquired)
    finally:
        await store.aclose()
    for statement in _BACK_TO_V4.format(ns=namespace).strip().split(";\n"):
        pg_server.execute(statement)
    pg_server.terminate_backends()
    store = _store(pg_server, namespace)
    try:
        assert (await store.get("old")) is not None
        assert isinstance(await store.acquire_slot("vllm:big", "a", capacity=1, ttl=30), SlotGrant)
        assert isinstance(await store.acquire_slot("vllm:big", "b", capacity=1, ttl=30), SlotWait)
        assert await store.slot_state("vllm:big") == SlotState("vllm:big", 1, 1)
        assert await store.pause_slot("vllm:big", 30) > 29  # migration 6: pauses
        assert (await store.acquire_slot("vllm:big", "c", capacity=3, ttl=30)).paused > 29
    finally:
        await store.aclose()
    rows = pg_server.execute(f"SELECT max(version) FROM {namespace}.ail_migrations")
    assert rows == [(VERSION,)] and VERSION == 7


_BACK_TO_V5 = """
DROP FUNCTION {ns}.ail_slot_pause, {ns}.ail_slot_reweigh;
DROP TABLE {ns}.ail_slot_pauses;
ALTER TABLE {ns}.ail_slots DROP COLUMN weight;
DELETE FROM {ns}.ail_migrations WHERE version > 5;
INSERT INTO {ns}.ail_migrations VALUES (5, clock_timestamp()) ON CONFLICT DO NOTHING
"""


async def test_a_schema_at_migration_5_keeps_its_slots_and_gains_pauses(
    pg_server: PostgresServer, namespace: str
) -> None:
    """A slot held before the upgrade is still held after it; a limit can then be paused."""
    store = _store(pg_server, namespace)
    try:
        held = await store.acquire_slot("vllm:big", "a", capacity=1, ttl=60)
        assert isinstance(held, SlotGrant)
    finally:
        await store.aclose()
    for statement in _BACK_TO_V5.format(ns=namespace).strip().split(";\n"):
        pg_server.execute(statement)
    pg_server.terminate_backends()
    store = _store(pg_server, namespace)
    try:
        assert await store.renew_slot(held.fence, 60)
        assert await store.pause_slot("vllm:big", 30) > 29
        waiting = await store.acquire_slot("vllm:big", "b", capacity=2, ttl=30)
        assert isinstance(waiting, SlotWait) and waiting.paused > 29
    finally:
        await store.aclose()
    rows = pg_server.execute(f"SELECT max(version) FROM {namespace}.ail_migrations")
    assert rows == [(VERSION,)]


_BACK_TO_V6 = """
DROP FUNCTION {ns}.ail_slot_reweigh;
ALTER TABLE {ns}.ail_slots DROP COLUMN weight;
DELETE FROM {ns}.ail_migrations WHERE version > 6;
INSERT INTO {ns}.ail_migrations VALUES (6, clock_timestamp()) ON CONFLICT DO NOTHING
"""


async def test_a_schema_at_migration_6_keeps_its_slots_and_gains_weights(
    pg_server: PostgresServer, namespace: str
) -> None:
    """A slot held before the upgrade counts one unit after it; weighted slots then work."""
    store = _store(pg_server, namespace)
    try:
        held = await store.acquire_slot("api:m~tpm", "a", capacity=100, ttl=60)
        assert isinstance(held, SlotGrant)
    finally:
        await store.aclose()
    for statement in _BACK_TO_V6.format(ns=namespace).strip().split(";\n"):
        pg_server.execute(statement)
    pg_server.terminate_backends()
    store = _store(pg_server, namespace)
    try:
        assert await store.renew_slot(held.fence, 60)
        big = await store.acquire_slot("api:m~tpm", "b", capacity=100, ttl=60, weight=99)
        assert isinstance(big, SlotGrant)
        assert await store.slot_state("api:m~tpm") == SlotState("api:m~tpm", 100, 0)
        assert await store.reweigh_slot(big.fence, 9)
        assert await store.slot_state("api:m~tpm") == SlotState("api:m~tpm", 10, 0)
    finally:
        await store.aclose()
    rows = pg_server.execute(f"SELECT max(version) FROM {namespace}.ail_migrations")
    assert rows == [(VERSION,)]


async def test_a_release_wakes_the_limits_waiters_not_a_jobs_followers(
    pg_server: PostgresServer, namespace: str
) -> None:
    """A freed slot's NOTIFY ends a waiter's wait at once; a follower of a job whose key is
    the limit's name sleeps on."""
    store = _store(pg_server, namespace)
    try:
        got = await store.acquire_slot("vllm:big", "a", capacity=1, ttl=30)
        assert isinstance(got, SlotGrant)
        await store.wait_slot("vllm:big", 2)  # LISTEN comes up (its first connect wakes all)
        slot_wait = asyncio.ensure_future(store.wait_slot("vllm:big", 20))
        job_wait = asyncio.ensure_future(store.wait("vllm:big", 1.5))
        await asyncio.sleep(0.3)  # real: both waits are filed before the release
        assert not slot_wait.done()
        started = time.monotonic()
        assert await store.release_slot(got.fence)
        await asyncio.wait_for(slot_wait, 10)
        assert time.monotonic() - started < 3
        assert not job_wait.done(), "a job's follower is not woken by a slot"
        await job_wait
    finally:
        await store.aclose()
