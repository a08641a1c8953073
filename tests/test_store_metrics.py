"""Store gauges read at scrape time, against real stores, scraped over loopback HTTP.

Each test builds a known state in a real SQLite file or a real redis-server, serves the
metrics (``serve_metrics``) and reads them back with an HTTP client, as Prometheus would.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired
from ai_lease.lease.queue import JobQueue, WorkerInfo
from ai_lease.observe.metrics import MAX_LABEL_VALUES, Metrics, MetricsServer, serve_metrics
from ai_lease.observe.store_metrics import StoreCollector, watch_store
from ai_lease.stores import open_store
from ai_lease.stores.postgres.store import PostgresStore
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.redis_server import RedisServer, free_port
from tests.test_metrics import parse, start_worker, stop, submit, total

REAL_TIME = "real stores scraped over loopback HTTP; one test blocks the loop for real"


Samples = dict[str, list[tuple[dict[str, str], float]]]


async def scrape(server: MetricsServer) -> Samples:
    """GET /metrics over loopback, as a scraper does (the store is read meanwhile)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(server.url)
    assert response.status_code == 200
    return parse(response.text)


@pytest.fixture
async def served(store: LeaseStore) -> AsyncIterator[tuple[Metrics, StoreCollector, MetricsServer]]:
    metrics = Metrics()
    collector = watch_store(metrics.registry, store, ttl=0.0, timeout=2.0)
    with serve_metrics(metrics, 0) as server:
        yield metrics, collector, server
    metrics.registry.unregister(collector)


def worker(worker_id: str, running: int, concurrency: int = 4) -> WorkerInfo:
    return WorkerInfo(worker_id, "host", 1, running, concurrency, 0.0, 0.0)


async def known_state(store: Any) -> None:
    """a: running on a live lease · b: due in an hour · c: cancelled, off the schedule ·
    d: handed back (lease lapsed, due now) · one worker running 2 of 4."""
    for key in "abcd":
        await store.submit(key, f'{{"key": "{key}"}}', key)
    granted = await store.acquire("a", "o1", ttl=60.0, max_no_progress=60.0)
    assert isinstance(granted, Acquired)
    await store.reschedule("b", time.time() + 3600)
    await store.cancel("c")
    await store.reschedule("c", None)
    held = await store.acquire("d", "o2", ttl=60.0, max_no_progress=60.0)
    assert isinstance(held, Acquired)
    assert await store.release(held.fence, error="boom")
    await store.worker_beat(worker("w1", 2), ttl=60.0)


async def test_gauges_read_the_store(
    store: LeaseStore, served: tuple[Metrics, StoreCollector, MetricsServer]
) -> None:
    """Queue depth, leases and workers on every store; jobs by status on SQLite and PostgreSQL."""
    _, _, server = served
    await known_state(store)
    got = await scrape(server)
    assert total(got, "store_up") == 1
    assert total(got, "queue_due") == 2  # a (still listed while it runs) and d
    assert total(got, "queue_scheduled") == 1  # b
    assert total(got, "leases_live") == 1  # a
    assert total(got, "leases_lapsed") == 1  # d, handed back, not yet taken again
    assert total(got, "worker_running_jobs", worker="w1") == 2
    assert total(got, "worker_concurrency", worker="w1") == 4
    assert 0 <= total(got, "store_read_seconds") < 2
    if isinstance(store, SQLiteStore | PostgresStore):
        by_status = {labels["status"]: v for labels, v in got["jobs"]}
        assert by_status == {"PENDING": 2, "RUNNING": 1, "DONE": 0, "FAILED": 0, "CANCELLED": 1}
    else:
        assert "jobs" not in got  # Redis keeps no count by status (see the module docstring)


async def test_a_reading_is_cached_for_ttl(
    store: LeaseStore, served: tuple[Metrics, StoreCollector, MetricsServer]
) -> None:
    """Within ``ttl`` a scrape serves the last reading; after it, a new one."""
    assert isinstance(store, JobQueue)
    _, collector, server = served
    await store.submit("one", "{}", "one")
    collector.ttl = 60.0
    assert total(await scrape(server), "queue_due") == 1
    await store.submit("two", "{}", "two")
    assert total(await scrape(server), "queue_due") == 1  # cached
    collector.ttl = 0.0
    assert total(await scrape(server), "queue_due") == 2


async def test_redis_scrape_never_scans_the_job_records(redis_server: RedisServer) -> None:
    """A scrape of a Redis store with 300 jobs uses the indexes: no SCAN, no job hash read."""
    redis_server.flushall()
    store = open_store(redis_server.url, op_timeout=2.0)
    admin = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        assert isinstance(store, RedisStore)
        for i in range(300):
            await store.submit(f"job-{i}", "{}", str(i))
        metrics = Metrics()
        watch_store(metrics.registry, store, ttl=0.0)
        admin.config_resetstat()
        with serve_metrics(metrics, 0) as server:
            got = await scrape(server)
        assert total(got, "queue_due") == 300
        used = {name.removeprefix("cmdstat_") for name in admin.info("commandstats")}
        assert used & {"scan", "keys", "hgetall", "hget", "hmget", "hscan"} == set(), used
    finally:
        admin.close()
        await store.aclose()


async def test_a_paused_or_dead_redis_gives_the_last_values_and_store_up_0() -> None:
    """SIGSTOP the server: the scrape still answers within the bound, with the last values
    and ``store_up 0``; SIGCONT: ``store_up 1`` again; killed: ``store_up 0``, at once."""
    with RedisServer() as server:
        store = open_store(server.url, op_timeout=0.5)
        metrics = Metrics()
        watch_store(metrics.registry, store, ttl=0.0, timeout=0.3)
        try:
            assert isinstance(store, JobQueue)
            await store.submit("k", "{}", "k")
            with serve_metrics(metrics, 0) as http:
                assert total(await scrape(http), "store_up") == 1
                server.pause()
                try:
                    started = time.monotonic()
                    got = await scrape(http)
                    assert time.monotonic() - started < 1.5
                    assert total(got, "store_up") == 0
                    assert total(got, "queue_due") == 1  # the last values, kept
                    assert total(got, "store_read_age_seconds") > 0
                finally:
                    server.resume()
                assert await _eventually_up(http)
                server.kill()
                started = time.monotonic()
                got = await scrape(http)
                assert time.monotonic() - started < 1.5
                assert total(got, "store_up") == 0 and total(got, "queue_due") == 1
        finally:
            await store.aclose()


async def _eventually_up(server: MetricsServer, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if total(await scrape(server), "store_up") == 1:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_blocked_event_loop_never_hangs_a_scrape(sqlite_store: SQLiteStore) -> None:
    """While the store's loop is blocked, a scrape answers after ``timeout`` (store_up 0);
    the read it started lands when the loop runs again."""
    metrics = Metrics()
    collector = watch_store(metrics.registry, sqlite_store, ttl=60.0, timeout=0.3)
    await sqlite_store.submit("k", "{}", "k")
    with serve_metrics(metrics, 0) as server:
        answer: dict[str, Any] = {}

        def scrape_from_a_thread() -> None:
            started = time.monotonic()
            answer["got"] = parse(httpx.get(server.url, timeout=10).text)
            answer["took"] = time.monotonic() - started

        thread = threading.Thread(target=scrape_from_a_thread)
        thread.start()
        time.sleep(1.2)  # noqa: ASYNC251 -- blocking the loop is the point
        thread.join(timeout=10)
        assert answer["took"] < 1.0
        assert total(answer["got"], "store_up") == 0
        await asyncio.sleep(0.2)  # the loop runs: the read started by that scrape lands
        got = await scrape(server)
    assert total(got, "store_up") == 1 and total(got, "queue_due") == 1
    assert collector.ttl == 60.0


async def test_a_scrape_on_the_stores_own_loop_does_not_wait(sqlite_store: SQLiteStore) -> None:
    """``exposition()`` called on the loop itself serves what it has and starts a read."""
    metrics = Metrics()
    watch_store(metrics.registry, sqlite_store, ttl=60.0)
    await sqlite_store.submit("k", "{}", "k")
    first = parse(metrics.exposition().decode())
    assert total(first, "store_up") == 0 and "queue_due" not in first
    await asyncio.sleep(0.2)
    again = parse(metrics.exposition().decode())
    assert total(again, "store_up") == 1 and total(again, "queue_due") == 1


async def test_workers_past_the_label_cap_are_summed_as_other(sqlite_store: SQLiteStore) -> None:
    """At most MAX_LABEL_VALUES worker series; the rest add up under worker="other"."""
    extra = 6
    for i in range(MAX_LABEL_VALUES + extra):
        await sqlite_store.worker_beat(worker(f"w{i:03d}", 1), ttl=60.0)
    metrics = Metrics()
    watch_store(metrics.registry, sqlite_store)
    with serve_metrics(metrics, 0) as server:
        got = await scrape(server)
    assert len(got["worker_running_jobs"]) == MAX_LABEL_VALUES + 1
    assert total(got, "worker_running_jobs", worker="other") == extra
    assert total(got, "worker_running_jobs") == MAX_LABEL_VALUES + extra


def test_worker_serves_the_store_gauges(tmp_path: Path) -> None:
    """`ai-lease worker --metrics-port` serves the store gauges beside the owner counters:
    the finished job under jobs{status="DONE"}, the worker itself, store_up 1."""
    asyncio.run(submit(tmp_path / "ai-lease.db", "cli-job"))
    port = free_port()
    node = start_worker(tmp_path, "--metrics-port", str(port), "--worker-id", "w-cli")
    try:
        deadline, got = time.monotonic() + 30, parse("")
        while total(got, "jobs", status="DONE") < 1 or "worker_concurrency" not in got:
            assert node.poll() is None, node.communicate()[1]
            assert time.monotonic() < deadline, f"no store gauges in /metrics: {dict(got)}"
            time.sleep(0.2)
            try:
                got = parse(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
            except httpx.TransportError:
                continue  # not listening yet
        assert total(got, "store_up") == 1
        assert total(got, "worker_concurrency", worker="w-cli") == 4
        assert total(got, "queue_due") + total(got, "leases_live") == 0
    finally:
        code, err = stop(node)
    assert code == 0, err


def test_a_closed_loop_reads_as_store_up_0() -> None:
    """After the worker's loop is gone, a late scrape answers store_up 0 (never raises)."""
    loop = asyncio.new_event_loop()
    metrics = Metrics()
    metrics.registry.register(StoreCollector(SQLiteStore(":memory:"), loop))
    loop.close()
    got = parse(metrics.exposition().decode())
    assert total(got, "store_up") == 0 and "queue_due" not in got
