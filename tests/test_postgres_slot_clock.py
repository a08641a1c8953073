"""A PostgreSQL slot's lease runs from when its limit's lock was had, not from when the call
arrived. Many callers of one limit queue on its row's lock; a place in an ``rpm`` window
granted after such a wait must still last its whole TTL. It used to be counted from the
arrival, so under contention a place lapsed up to seconds early and a server counting its
own minute saw more than ``rpm`` calls in one (tests/test_limits_rate_fleet.py, 66 of 60)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from ai_lease.lease.slots import SlotGrant
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer

REAL_TIME = "another connection holds the limit's lock for a real second"

pytestmark = pytest.mark.postgres

LIMIT, TTL, HELD = "m~rpm", 61.0, 1.0


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_sc_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


async def _lock_held(pg_server: PostgresServer, namespace: str) -> psycopg.AsyncConnection:
    """A connection holding ``LIMIT``'s row lock, in a transaction it has not ended."""
    conn = await psycopg.AsyncConnection.connect(pg_server.url)
    await conn.execute(
        f"SELECT 1 FROM {namespace}.ail_slot_limits WHERE limit_name = %s FOR UPDATE", (LIMIT,)
    )
    return conn


async def test_a_grant_after_a_wait_for_the_limits_lock_lasts_its_whole_ttl(
    pg_server: PostgresServer, namespace: str
) -> None:
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=10.0)
    try:
        first = await store.acquire_slot(LIMIT, "first", capacity=5, ttl=TTL)
        assert isinstance(first, SlotGrant)  # the limit's row exists now
        conn = await _lock_held(pg_server, namespace)
        try:
            asking = asyncio.ensure_future(store.acquire_slot(LIMIT, "second", capacity=5, ttl=TTL))
            await asyncio.sleep(HELD)  # real: the other caller holds the lock this long
            assert not asking.done(), "the acquire did not wait for the limit's lock"
            await conn.commit()
        finally:
            await conn.close()
        grant = await asking
        assert isinstance(grant, SlotGrant)
        # the server is on this machine: its clock is ours
        left = grant.expires_at - time.time()
        assert left > TTL - HELD / 2, f"the place lapses {TTL - left:.2f}s early"
        renewed = await store.renew_slot(grant.fence, TTL)
        assert renewed
    finally:
        await store.aclose()
