"""The store contract and one end-to-end job on a real three-master Redis Cluster."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from ai_lease import LeaseStore, open_store
from ai_lease.job import Job
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.testing.contract import (
    DurationHistoryContract,
    JobQueueContract,
    LeaseStoreContract,
    ListingContract,
    SlotContract,
    TimelineContract,
)
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.redis_cluster import RedisCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as started:
        yield started


class ClusterStore:
    @pytest.fixture
    def store_url(self, cluster: RedisCluster) -> str:
        return cluster.url

    @pytest.fixture
    async def store(self, store_url: str) -> AsyncIterator[LeaseStore]:
        store = open_store(store_url, op_timeout=2.0)
        yield store
        await store.aclose()


class TestClusterContract(ClusterStore, LeaseStoreContract):
    """Every lease operation is one script on one slot: valid on Redis Cluster."""


class TestClusterQueue(ClusterStore, JobQueueContract):
    """The job queue works on Redis Cluster."""


class TestClusterHistory(ClusterStore, DurationHistoryContract):
    """Duration history works on Redis Cluster."""


class TestClusterTimeline(ClusterStore, TimelineContract):
    """Each job's timeline shares its hash tag: written and read on one slot."""


class TestClusterSlots(ClusterStore, SlotContract):
    """Every slot script touches one limit's keys, under one hash tag: one slot each."""


class TestClusterListing(ListingContract):
    """Job pages and counts on Cluster, where no script can keep the creation index (the
    namespace's keys are in another slot): a SCAN per call. A namespace per test."""

    @pytest.fixture
    async def store(self, cluster: RedisCluster) -> AsyncIterator[LeaseStore]:
        namespace = f"listing-{uuid.uuid4().hex[:12]}"
        store = open_store(cluster.url, namespace=namespace, op_timeout=2.0)
        yield store
        await store.aclose()


async def test_a_job_end_to_end_on_the_cluster(cluster: RedisCluster) -> None:
    """Two runners race one job on the cluster: one model call, one result."""
    store = open_store(cluster.url)
    try:
        provider = ScriptedProvider(["clustered ", "answer"])
        runners = [
            Runner(store, provider=provider, config=RunConfig(node_id=f"n{i}")) for i in range(2)
        ]
        import asyncio

        records = await asyncio.gather(*(r.run(Job("cluster-job", input="x")) for r in runners))
        assert {r.output for r in records} == {"clustered answer"} and provider.calls == 1
        await runners[0].flush_history()
    finally:
        await store.aclose()


async def test_keys_with_braces_work_on_the_cluster(cluster: RedisCluster) -> None:
    """A key starting with '}' (or holding braces anywhere) gets a whole hash tag: its
    scripts run on one slot, and list_jobs names it back exactly."""
    from ai_lease.lease import Acquired

    store = open_store(cluster.url)
    keys = ["}starts-with-brace", "{whole}", "mid}dle{", "per%7Dcent"]
    try:
        for key in keys:
            won = await store.acquire(key, "A", ttl=30, max_no_progress=5)
            assert isinstance(won, Acquired), key
            assert (await store.commit(won.fence, f"r-{key}")).result == f"r-{key}"
        listed = {job.key for job in await store.list_jobs(status="DONE", limit=1000)}
        assert set(keys) <= listed
    finally:
        await store.aclose()
