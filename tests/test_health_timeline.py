"""JobState.health on real owner processes (the first seed's section 16), on both stores.

A SIGKILLed owner's lease runs on for its TTL, but its heartbeat stops at once: the record
reads ``node lost`` within renew_interval + grace, and ``dead`` once max_no_progress has
passed too — never ``zombie``. A hung stage whose keeper keeps renewing (stall policy
``alert``) reads ``zombie``. A working owner reads ``healthy``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ai_lease import open_store
from ai_lease.job import Health, JobState
from ai_lease.lease.base import LeaseStore
from tests.harness.node import Cluster

REAL_TIME = "the owners are real processes; health is read from a real store"


pytestmark = pytest.mark.slow

TTL, RENEW, MNP = 9.0, 0.4, 3.0  # a lease far longer than the judgements below
GRACE = RENEW  # health()'s default: one renew interval
SLACK = 0.6
KEY = "health-job"


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[LeaseStore]:
    opened = open_store(store_url)
    yield opened
    await opened.aclose()


async def record(store: LeaseStore) -> JobState:
    job = await store.get(KEY)
    assert job is not None
    return job


async def health_until(store: LeaseStore, want: Health, timeout: float) -> list[Health | None]:
    """Poll the record's health until it reads ``want``; return every state seen."""
    seen: list[Health | None] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append((await record(store)).health())
        if seen[-1] is want:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {want.value} within {timeout:g}s: saw {seen}")


async def test_killed_owner_is_node_lost_then_dead_never_zombie(
    store_url: str, store: LeaseStore, tmp_path: Path
) -> None:
    async with Cluster(store_url, KEY, tmp_path, ttl=TTL, renew=RENEW, mnp=MNP) as cluster:
        owner = await cluster.start("A", "slow", extra=("--slow-for", "60"))
        await owner.wait_for(
            lambda evs: len([e for e in evs if e["kind"] == "renewed"]) >= 2, "renewals"
        )
        assert (await record(store)).health() is Health.HEALTHY  # renewing and progressing
        owner.signal(signal.SIGKILL)
        await owner.exited()
        killed = time.monotonic()
        seen = await health_until(store, Health.NODE_LOST, RENEW + GRACE + SLACK)
        lost = await record(store)
        assert lost.lease_live, "node lost while the lease still runs"
        seen += await health_until(store, Health.DEAD, MNP + GRACE + SLACK)
        dead_after = time.monotonic() - killed
        assert (await record(store)).lease_live and dead_after < TTL
        assert Health.ZOMBIE not in seen, seen


async def test_hung_stage_with_live_keeper_is_zombie(
    store_url: str, store: LeaseStore, tmp_path: Path
) -> None:
    """Under the alert policy the keeper renews while the stream hangs: heartbeat fresh,
    progress stale."""
    async with Cluster(
        store_url, KEY, tmp_path, ttl=TTL, renew=RENEW, mnp=MNP, policy="alert"
    ) as cluster:
        owner = await cluster.start("A", "hang-async")
        await owner.wait_for_event("acquired", "A to own the job")
        assert (await record(store)).health() is Health.HEALTHY
        seen = await health_until(store, Health.ZOMBIE, MNP + GRACE + RENEW + SLACK + 1.0)
        assert Health.NODE_LOST not in seen and Health.DEAD not in seen, seen
        job = await record(store)
        assert job.since_heartbeat is not None and job.since_heartbeat <= RENEW + GRACE
