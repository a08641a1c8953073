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
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ai_lease import LeaseStore, LeaseTimings, Status, open_store
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.observe.cpu_idle import STUCK_WAIT_PCT, cpu_idle_of
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.run.runner import Runner
from ai_lease.run.stages import call_ai
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Pause, ScriptedProvider

REAL_TIME = "the stages run in child processes, stopped by the real ladder"


TIMINGS = LeaseTimings(
    ttl=2.0, renew_interval=0.3, op_timeout=0.25, poll_interval=0.1, self_fence_margin=0.5
)


def scripted(*chunks: str) -> ScriptedProvider:
    """The children's provider factory (module level: picklable by reference)."""
    return ScriptedProvider(list(chunks))


OK_FACTORY = functools.partial(scripted, "ok")


def hang_once_in_thread(ctx: StageContext) -> Any:
    """A sync call_ai (run in a stage thread of the child) that, on the first attempt
    (per mark file), hangs in ``time.sleep``; later attempts call the model."""
    if first_time(ctx.job.variables["mark"]):
        stuck_in_a_blocking_call()
    return asyncio.run(call_ai(ctx))


def first_time(mark: str) -> bool:
    """True the first time for ``mark`` (the file then holds this process's pid)."""
    if os.path.exists(mark):
        return False
    Path(mark).write_text(str(os.getpid()))
    return True


def gone(pid: int) -> bool:
    """Whether process ``pid`` has no /proc entry any more."""
    return not os.path.exists(f"/proc/{pid}")


def stuck_in_a_blocking_call() -> None:
    time.sleep(3600)


async def hang_on_loop(ctx: StageContext) -> Any:
    """An async call_ai that blocks the child's event loop (first attempt only)."""
    if first_time(ctx.job.variables["mark"]):
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
    factory: Callable[[], Any] = OK_FACTORY,
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
                if worker.pool is not None:  # the pool is full again: every child idle
                    await asyncio.sleep(0.2)
                    assert worker.pool.idle_count() == worker.concurrency
                return
            assert time.monotonic() - started < timeout, f"not done: {records}"
            assert not task.done(), task
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid``."""
    found, todo = set(), [pid]
    while todo:
        below = children_of(todo.pop())
        found |= below
        todo.extend(below)
    return found


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


def hanging(fn: Any) -> Pipeline:
    return Pipeline.default().replace("call_ai", Stage("call_ai", fn, max_no_progress=0.5))


async def assert_ladder(
    store: LeaseStore, tmp_path: Path, fn: Any, signals: list[str], **variables: Any
) -> None:
    """A job whose first attempt hangs in ``fn`` ends DONE once, its child stopped by
    ``signals`` (the ladder's steps), its snapshot naming the stuck function, with no child
    of it left."""
    events: list[Event] = []
    mark = tmp_path / "hung"
    worker = make_worker(store, events, pipeline=hanging(fn), grace=0.5)
    await submit(store, ["stuck"], mark=str(mark), **variables)
    await run_until_done(worker, store, ["stuck"], timeout=60)
    record = await store.get("stuck")
    assert record is not None and record.status is Status.DONE, record
    assert record.output == "ok" and record.attempts == 2, record
    assert "stuck_in_a_blocking_call" in (record.stall_snapshot or ""), record.stall_snapshot
    idle = cpu_idle_of(record.stall_snapshot)  # a sleep: a stuck wait, not work
    assert isinstance(idle, float) and idle >= STUCK_WAIT_PCT, record.stall_snapshot
    terminated = [e for e in events if e.kind == "terminated"]
    assert [e.attrs["signal"] for e in terminated if e.attrs] == signals, terminated
    assert [e.kind for e in events].count("committed") == 1
    hung_pid = int(mark.read_text())
    assert gone(hung_pid), f"child {hung_pid} is still there"
    assert worker.pool is not None and worker.pool.started == 2 + 1  # one replacement
    await assert_ladder_noted(store, "stuck", signals, hung_pid)


async def assert_ladder_noted(store: LeaseStore, key: str, signals: list[str], pid: int) -> None:
    """The ladder's steps are in the job's stored timeline: one ``terminated`` per signal
    (its detail led by it) then ``reaped``, under the stopped attempt's fence, after the
    stall and before the job's commit."""
    entries, _ = await store.timeline(key)  # type: ignore[attr-defined]
    kinds = [e.kind for e in entries]
    steps = [e for e in entries if e.kind in ("terminated", "reaped")]
    assert [e.kind for e in steps] == ["terminated"] * len(signals) + ["reaped"], kinds
    assert [e.detail.split(":")[0] for e in steps[:-1]] == signals
    assert f"pid {pid}" in steps[-1].detail, steps[-1]
    first = next(e for e in entries if e.kind == "acquired")
    assert {(e.owner_id, e.token) for e in steps} == {(first.owner_id, first.token)}
    assert kinds.index("stalled") < kinds.index("terminated") < kinds.index("committed")


async def test_a_child_hung_in_a_stage_thread_is_snapshotted_and_stopped_by_sigterm(
    store: LeaseStore, tmp_path: Path
) -> None:
    """A sync stage hung in the child's thread: stalled, snapshotted, SIGTERM ends it;
    the job is retried and ends DONE once."""
    await assert_ladder(store, tmp_path, hang_once_in_thread, ["term"])


async def test_a_child_ignoring_sigterm_with_a_blocked_loop_is_sigkilled(
    store: LeaseStore, tmp_path: Path
) -> None:
    """A stage blocking the child's event loop and ignoring SIGTERM: the snapshot still
    names the stuck function (taken by signal), SIGKILL ends it after the grace."""
    await assert_ladder(store, tmp_path, hang_on_loop, ["term", "kill"], ignore_term=1)


async def test_cancelling_a_running_job_stops_its_child(store: LeaseStore, tmp_path: Path) -> None:
    """A job cancelled while its child hangs: the lost lease stops the child (snapshot,
    SIGTERM), the job stays CANCELLED and the child's process is gone."""
    events: list[Event] = []
    mark = tmp_path / "hung"
    pipeline = Pipeline.default().replace("call_ai", Stage("call_ai", hang_on_loop))
    worker = make_worker(store, events, pipeline=pipeline, grace=0.5)
    await submit(store, ["cancel-me"], mark=str(mark))
    task = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if mark.exists():
                break
            await asyncio.sleep(0.05)
        await store.cancel("cancel-me", "no longer wanted")
        for _ in range(200):
            if any(e.kind == "terminated" for e in events):
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)
    record = await store.get("cancel-me")
    assert record is not None and record.status is Status.CANCELLED, record
    assert [e.attrs["signal"] for e in events if e.kind == "terminated" and e.attrs] == ["term"]
    assert gone(int(mark.read_text()))


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}


CHOSEN_BY = {  # how process isolation is chosen: flags, or the [worker] settings
    "flags": ((), ("--isolation", "process", "--terminate-grace", "2")),
    "environment": (
        (("AI_LEASE_WORKER__ISOLATION", "process"), ("AI_LEASE_WORKER__TERMINATE_GRACE", "2")),
        (),
    ),
}


@pytest.mark.parametrize("chosen_by", sorted(CHOSEN_BY))
async def test_the_worker_command_runs_jobs_in_child_processes(
    tmp_path: Path, chosen_by: str
) -> None:
    """`ai-lease worker --isolation process` (or AI_LEASE_WORKER__ISOLATION=process) runs
    jobs to DONE in its warm children and exits 0 on SIGTERM, leaving no child behind."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = open_store(url)
    keys = [f"cli-{i}" for i in range(3)]
    variables, flags = CHOSEN_BY[chosen_by]
    try:
        await submit(store, keys)
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ai_lease", "--store", url, "worker"),
            *(*flags, "--sweep-interval", "0.1"),
            cwd=tmp_path,
            env={**_env(), **dict(variables)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            for key in keys:
                while (record := await store.get(key)) is None or not record.status.terminal:
                    assert time.monotonic() < deadline, "the worker did not run the jobs"
                    assert worker.returncode is None, "the worker exited"
                    await asyncio.sleep(0.1)
                assert record.status is Status.DONE, record.last_error
            children = descendants(worker.pid)
            assert len(children) >= 4 + 1, children  # 4 warm children and the forkserver
        finally:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(worker.communicate(), 30)
        assert worker.returncode == 0, err.decode()
        assert "warm children" in err.decode(), err.decode()
        for _ in range(100):  # the forkserver and the tracker exit on their pipes' EOF
            if all(gone(pid) for pid in children):
                break
            await asyncio.sleep(0.05)
        assert all(gone(pid) for pid in children), children
    finally:
        await store.aclose()


async def test_the_isolation_flag_beats_the_settings(tmp_path: Path) -> None:
    """--isolation task over AI_LEASE_WORKER__ISOLATION=process: the job runs, no child
    process is started."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    store = open_store(url)
    try:
        await submit(store, ["flag"])
        worker = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ai_lease", "--store", url, "worker"),
            *("--isolation", "task", "--sweep-interval", "0.1"),
            cwd=tmp_path,
            env={**_env(), "AI_LEASE_WORKER__ISOLATION": "process"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 60
            while (record := await store.get("flag")) is None or not record.status.terminal:
                assert time.monotonic() < deadline and worker.returncode is None
                await asyncio.sleep(0.1)
            assert record.status is Status.DONE and not descendants(worker.pid)
        finally:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(worker.communicate(), 30)
        assert worker.returncode == 0 and "warm children" not in err.decode(), err.decode()
    finally:
        await store.aclose()


def test_the_worker_command_refuses_a_grace_over_300_seconds(tmp_path: Path) -> None:
    """worker --terminate-grace 301: exit 2 naming the flag."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "ai_lease", "--store", f"sqlite:///{tmp_path / 'j.db'}"),
            *("worker", "--isolation", "process", "--terminate-grace", "301"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 2 and "--terminate-grace" in out.stderr, out.stderr


def paced(*chunks: str) -> ScriptedProvider:
    """A model that streams one chunk every 0.15 s (module level: picklable)."""
    script: list[Any] = []
    for chunk in chunks:
        script += [Pause(0.15), chunk]
    return ScriptedProvider(script)


async def test_progress_marks_in_the_child_keep_the_lease(store: LeaseStore) -> None:
    """A 2 s stream in the child, with a 0.5 s no-progress budget: its chunks reach the
    parent's keeper through shared memory, so the lease is renewed and the job is not
    stalled; the renewals carry the child's progress version."""
    events: list[Event] = []
    pipeline = Pipeline.default().replace("call_ai", Stage("call_ai", call_ai, max_no_progress=0.5))
    factory = functools.partial(paced, *(["word "] * 13))
    worker = make_worker(store, events, pipeline=pipeline, factory=factory)
    await submit(store, ["streamed"])
    await run_until_done(worker, store, ["streamed"], timeout=30)
    record = await store.get("streamed")
    assert record is not None and record.status is Status.DONE, record
    assert record.attempts == 1 and record.output == "word " * 13, record  # exactly as sent
    kinds = [e.kind for e in events]
    assert "stalled" not in kinds and "terminated" not in kinds, kinds
    assert kinds.count("renewed") >= 3, kinds
    assert sum(e.value or 0 for e in events if e.kind == "renewed") >= 8  # chunks counted


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"isolation": "thread"}, "Worker.isolation"),
        ({"isolation": "process", "terminate_grace": 301}, "Worker.terminate_grace"),
        ({"isolation": "process", "terminate_grace": -1}, "Worker.terminate_grace"),
        ({"isolation": "process"}, "provider_factory"),
    ],
)
async def test_a_worker_refuses_isolation_settings_it_cannot_run(
    sqlite_store: LeaseStore, kwargs: dict[str, Any], named: str
) -> None:
    """An unknown isolation, a grace outside 0-300 s, or a provider object without a
    factory for the children: ValueError naming the field."""
    runner = Runner(sqlite_store, provider=scripted("ok"), config=RunConfig(trace=False))
    with pytest.raises(ValueError, match=named):
        Worker(sqlite_store, runner, **kwargs)
