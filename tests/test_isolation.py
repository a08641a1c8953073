"""Process isolation: jobs' stages run in warm child processes, stopped by the ladder.

Real workers (:class:`~ai_lease.run.worker.Worker`, ``isolation="process"``) against the
``store`` fixture (SQLite and a real redis-server), real child processes and real signals:
a job whose stage hangs in its child is stalled by the parent's keeper, snapshotted (the
stored snapshot names the stuck function), SIGTERMed, SIGKILLed when it ignores SIGTERM,
and taken over; afterwards no process of it remains and the pool is full again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ai_lease import LeaseStore, LeaseTimings, Status
from ai_lease.job import Job
from ai_lease.observe.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.pipeline import Pipeline, Stage, StageContext
from ai_lease.run.runner import Runner
from ai_lease.run.stages import call_ai
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import ScriptedProvider

TIMINGS = LeaseTimings(
    ttl=2.0, renew_interval=0.3, op_timeout=0.25, poll_interval=0.1, self_fence_margin=0.5
)
HANG_MARK = Path(os.environ.get("TMPDIR", "/tmp")) / f"ai-lease-hang-{os.getpid()}"


def scripted(*chunks: str) -> ScriptedProvider:
    """The children's provider factory (module level: picklable by reference)."""
    return ScriptedProvider(list(chunks))


def hang_once_ignoring_term(ctx: StageContext) -> Any:
    """A sync call_ai that, the first time (per mark file), ignores SIGTERM and hangs in
    ``time.sleep`` on the child's main thread; later attempts call the model."""
    mark = Path(ctx.job.variables["mark"])
    if not mark.exists():
        mark.write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stuck_in_a_blocking_call()
    return asyncio.run(call_ai(ctx))


def stuck_in_a_blocking_call() -> None:
    time.sleep(3600)


async def hang_on_loop(ctx: StageContext) -> Any:
    """An async call_ai that blocks the child's event loop (first attempt only)."""
    mark = Path(ctx.job.variables["mark"])
    if not mark.exists():
        mark.write_text(str(os.getpid()))
        if ctx.job.variables.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stuck_in_a_blocking_call()
    return await call_ai(ctx)


def make_worker(
    store: LeaseStore,
    events: list[Event],
    *,
    pipeline: Pipeline | None = None,
    isolation: str = "process",
    concurrency: int = 2,
    grace: float = 1.0,
    factory: Callable[[], Any] = functools.partial(scripted, "ok"),
) -> Worker:
    runner = Runner(
        store,
        provider=factory(),
        pipeline=pipeline,
        config=RunConfig(timings=TIMINGS, node_id="w1", trace=False),
        hooks=RunHooks(on_event=events.append),
    )
    return Worker(
        store,
        runner,
        concurrency=concurrency,
        sweep_interval=0.05,
        grace=1.0,
        worker_id="w1",
        on_event=events.append,
        isolation=isolation,
        provider_factory=factory if isolation == "process" else None,
        terminate_grace=grace,
    )


async def submit(store: LeaseStore, keys: list[str], **variables: Any) -> None:
    runner = Runner(store, config=RunConfig(trace=False))
    for key in keys:
        await runner.submit(Job(key, input=key, prompt_text="{{ input }}", variables=variables))


async def run_until_done(
    worker: Worker, store: LeaseStore, keys: list[str], timeout: float
) -> None:
    """Run ``worker`` until every key has ended, then stop it."""
    task = asyncio.create_task(worker.run())
    started = time.monotonic()
    try:
        while True:
            records = [await store.get(key) for key in keys]
            if all(r is not None and r.status.terminal for r in records):
                return
            assert time.monotonic() - started < timeout, f"not done: {records}"
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)


def children_of(pid: int) -> set[int]:
    """Live child pids of ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


async def test_process_jobs_end_done_with_the_same_results_as_task_jobs(
    store: LeaseStore,
) -> None:
    """Jobs run with isolation=process end DONE with the results task isolation gives."""
    results: dict[str, dict[str, Any]] = {}
    for isolation in ("task", "process"):
        keys = [f"{isolation}-{i}" for i in range(6)]
        await submit(store, keys)
        worker = make_worker(store, [], isolation=isolation)
        await run_until_done(worker, store, keys, timeout=30)
        for key in keys:
            record = await store.get(key)
            assert record is not None and record.status is Status.DONE, record
            results.setdefault(key.split("-")[1], {})[isolation] = record.output
    assert all(r["task"] == r["process"] == "ok" for r in results.values()), results
