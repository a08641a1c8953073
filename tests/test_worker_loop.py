"""The worker loop in one process, on SQLite and on a real redis-server.

Each test runs a real :class:`~ai_lease.run.worker.Worker` against the ``store`` fixture with
fast lease timings and a scripted model, plants what a careless user or a broken
process leaves in the store (a bad spec, a corrupt record, an abandoned lease), and asserts
on the records and on the worker's own events.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from ai_lease import LeaseStore, LeaseTimings, Status
from ai_lease.job import Job
from ai_lease.lease.base import Acquired
from ai_lease.lease.events import Event
from ai_lease.lease.queue import JobQueue
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Pause, ScriptedProvider

REAL_TIME = "the worker loop runs on SQLite (its thread) and a real redis-server"


TTL, SWEEP = 2.0, 0.1
TIMINGS = LeaseTimings(
    ttl=TTL, renew_interval=0.5, op_timeout=0.4, poll_interval=0.1, self_fence_margin=0.5
)


def make_worker(
    store: LeaseStore, events: list[Event], *, concurrency: int = 2, job_seconds: float = 0.0
) -> Worker:
    script: list[Any] = [Pause(job_seconds)] if job_seconds else []
    provider = ScriptedProvider([*script, "ok"])
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(timings=TIMINGS, node_id="w1", trace=False),
        hooks=RunHooks(on_event=events.append),
    )
    return Worker(
        store,
        runner,
        concurrency=concurrency,
        sweep_interval=SWEEP,
        grace=1.0,
        worker_id="w1",
        on_event=events.append,
    )


async def run_until(
    worker: Worker, done: Callable[[], Any], timeout: float, *, at_least: float = 0.0
) -> None:
    """Run ``worker`` until ``await done()`` is true (and ``at_least`` seconds passed)."""
    task = asyncio.create_task(worker.run())
    started = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= at_least and await done():
                return
            assert elapsed < timeout, f"not done within {timeout:g}s"
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


async def submit_good(store: LeaseStore, keys: list[str]) -> None:
    runner = Runner(store, config=RunConfig(trace=False))
    for key in keys:
        await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))


def all_status(store: LeaseStore, keys: list[str], status: Status) -> Callable[[], Any]:
    async def check() -> bool:
        for key in keys:
            record = await store.get(key)
            if record is None or record.status is not status:
                return False
        return True

    return check


def plant_corrupt(store_url: str, key: str) -> None:
    """A queued key whose stored record is not an ai_lease record (another writer's value)."""
    if store_url.startswith("sqlite"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"), isolation_level=None)
        with conn:
            conn.execute(
                "INSERT INTO ai_lease_jobs (key, status, lease_expires_at, record)"
                " VALUES (?, 'PENDING', NULL, ?)",
                (key, b"\x00garbage"),
            )
            conn.execute("INSERT INTO ai_lease_queue VALUES (?, 0)", (key,))
        conn.close()
    elif store_url.startswith("postgres"):  # typed columns: a status no ai_lease writes
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as pg:
            pg.execute(
                "INSERT INTO ai_lease.ail_jobs (key, status, created_at, updated_at)"
                " VALUES (%s, 'garbage', 1, 1)",
                (key,),
            )
            pg.execute("INSERT INTO ai_lease.ail_queue VALUES (%s, 0)", (key,))
    else:
        client = redis.Redis.from_url(store_url)
        client.hset(f"ai_lease:{{{key}}}:job", mapping={"foo": "bar"})
        client.zadd("ai_lease:queue", {key: 0})
        client.close()


# -- item 5: a job the worker cannot prepare ends FAILED at once --------------------------------


async def test_unpreparable_jobs_fail_at_once_with_their_reason(store: LeaseStore) -> None:
    """A bad stored spec or missing input ends FAILED with its reason, not PENDING forever."""
    assert isinstance(store, JobQueue)
    await store.submit("bad-json", "{not json", "fp-1")
    await store.submit("bad-field", '{"key": "bad-field", "colour": "red"}', "fp-2")
    missing = Job("no-input", input_file="/nonexistent/ai-lease-input.txt")
    await store.submit(missing.key, missing.to_spec(), missing.fingerprint())
    await submit_good(store, ["good-1"])
    keys = ["bad-json", "bad-field", "no-input"]
    events: list[Event] = []
    started = time.monotonic()
    await run_until(make_worker(store, events), all_status(store, keys, Status.FAILED), 5.0)
    assert time.monotonic() - started < TTL, "preparation failures waited for a lease TTL"
    reasons = {key: (await store.get(key)).last_error or "" for key in keys}  # type: ignore[union-attr]
    assert "spec" in reasons["bad-json"], reasons
    assert "colour" in reasons["bad-field"], reasons
    assert "ai-lease-input.txt" in reasons["no-input"] or "input" in reasons["no-input"], reasons
    assert await all_status(store, ["good-1"], Status.DONE)()
    assert {e.key for e in events if e.kind == "job_failed"} >= set(keys)
    assert not [e for e in events if e.kind == "job_error"], [str(e) for e in events]


# -- item 6: a corrupt queued entry is quarantined, never spun on ------------------------------


async def test_corrupt_queue_entry_is_quarantined_not_spun_on(
    store: LeaseStore, store_url: str
) -> None:
    """A corrupt queued record is reported once and looked at <= once per sweep; others run."""
    keys = [f"good-{i}" for i in range(6)]
    await submit_good(store, keys)
    plant_corrupt(store_url, "corrupt-1")
    events: list[Event] = []
    worker = make_worker(store, events)
    started = time.monotonic()
    await run_until(worker, all_status(store, keys, Status.DONE), 10.0, at_least=2.0)
    sweeps = (time.monotonic() - started) / SWEEP
    errors = [e for e in events if e.kind == "job_error"]
    reports = [e for e in events if e.kind == "job_quarantined"]
    assert len(errors) <= 1, f"{len(errors)} job_error events in ~2 s"
    assert [e.key for e in reports] == ["corrupt-1"], [str(e) for e in events]
    assert "not an ai_lease job record" in reports[0].detail
    assert set(worker.quarantined) == {"corrupt-1"}
    looks = worker.quarantined["corrupt-1"].looks
    assert looks <= sweeps + 1, f"{looks} looks in {sweeps:.0f} sweep intervals"


# -- item C: an abandoned job is recovered before the backlog ----------------------------------


async def test_abandoned_job_is_recovered_before_a_backlog(store: LeaseStore) -> None:
    """A sweep asks for recoveries first: an expired lease is taken within TTL + one sweep
    even behind a backlog of 10x the worker's capacity."""
    assert isinstance(store, JobQueue)
    await submit_good(store, ["orphan"])
    # The dead owner: it acquired the job, left the queue entry a worker leaves (a recovery
    # look when its lease may lapse) and died.
    won = await store.acquire("orphan", "dead#1", ttl=TTL, max_no_progress=5.0)
    assert isinstance(won, Acquired)
    await store.recover_at("orphan", won.job.read_at + TTL)
    backlog = [f"backlog-{i:02d}" for i in range(40)]  # 10x the capacity below
    await submit_good(store, backlog)
    events: list[Event] = []
    worker = make_worker(store, events, concurrency=4, job_seconds=1.0)
    lapses_at = time.time() + won.job.lease_remaining
    await run_until(worker, all_status(store, ["orphan"], Status.DONE), 20.0)
    taken = next(e for e in events if e.kind == "acquired" and e.key == "orphan")
    assert taken.at - lapses_at <= SWEEP + 1.0, (
        f"orphan taken {taken.at - lapses_at:.2f}s after its lease lapsed"
    )
    assert not await all_status(store, backlog, Status.DONE)(), "the backlog ran out first"


# -- item 18: the constructor refuses values that cannot work ----------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", 0),
        ("concurrency", -3),
        ("concurrency", 1.5),
        ("sweep_interval", 0.0),
        ("sweep_interval", math.nan),
        ("sweep_interval", math.inf),
        ("grace", -1.0),
        ("grace", math.nan),
    ],
)
async def test_worker_refuses_bounds_naming_the_field(
    sqlite_store: LeaseStore, field: str, value: float
) -> None:
    """Worker(concurrency=0 / sweep_interval=0, nan / grace=-1) raises ValueError naming it."""
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=f"Worker.{field}"):
        Worker(sqlite_store, Runner(sqlite_store), **kwargs)


async def test_a_worker_reports_the_keys_it_runs(store: LeaseStore) -> None:
    """While a job runs, the worker's heartbeat names it (``ai-lease workers`` shows it)."""
    assert isinstance(store, JobQueue)
    await submit_good(store, ["slow-report"])
    worker = make_worker(store, [], job_seconds=4.0)

    async def named() -> bool:
        return any(w.jobs == ("slow-report",) for w in await store.list_workers())

    await run_until(worker, named, timeout=15)
