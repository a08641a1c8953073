"""Workers in separate OS processes sharing one store, on SQLite and on Redis.

Each worker is ``tests/harness/worker_proc.py``: a real ``Worker`` with fast lease timings
(TTL 2 s, renewal every 0.5 s, sweep every 0.2 s) and a scripted model whose calls take
``job_seconds``. Jobs are submitted from the test (one through ``ai-lease submit
--detach``); assertions read the store's records and every worker's history file
(``tests/harness/history.py``): every key ends DONE with exactly one ``committed`` event
across all histories, carrying the stored (token, owner), and no write with an older token
was accepted. Waits poll with bounds; timing assertions use the events' own timestamps.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from ai_lease import JobState, LeaseStore, Status
from ai_lease.job import Job
from ai_lease.run.runner import Runner
from tests.harness.history import check_invariants, of_kind
from tests.harness.node import REPO_ROOT, NodeProcess
from tests.harness.worker_proc import Workers

REAL_TIME = "workers are separate OS processes sharing one store"


pytestmark = pytest.mark.slow

TTL, RENEW, SWEEP, POLL, MNP = 2.0, 0.5, 0.2, 0.1, 1.0
SLACK = 1.0  # scheduling slack on top of every timing bound (2 cores, several processes)
HANDOVER_BOUND = SWEEP + POLL + SLACK  # a released job is taken "after a poll", not a TTL

Events = list[dict[str, Any]]


@pytest.fixture
async def workers(store_url: str, tmp_path: Path) -> AsyncIterator[Workers]:
    async with Workers(store_url, tmp_path, ttl=TTL, renew=RENEW, sweep=SWEEP) as running:
        yield running


# -- helpers -----------------------------------------------------------------------------------


async def submit(store: LeaseStore, keys: Iterable[str]) -> None:
    runner = Runner(store)
    for key in keys:
        await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))


async def wait_all_done(
    store: LeaseStore, keys: Iterable[str], workers: Workers, timeout: float = 60.0
) -> None:
    """Until every key is DONE; fails at once on a FAILED job, with the histories on timeout."""
    left = set(keys)
    deadline = time.monotonic() + timeout
    while left:
        for key in sorted(left):
            record = await store.get(key)
            if record is not None and record.status is Status.FAILED:
                raise AssertionError(f"{key} FAILED: {record.last_error}\n{workers.dump()}")
            if record is not None and record.status is Status.DONE:
                left.discard(key)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(left)} jobs not DONE after {timeout:g}s: {sorted(left)[:10]}\n"
                f"{workers.dump()[-20000:]}"
            )
        await asyncio.sleep(0.1)


async def assert_done_exactly_once(
    workers: Workers,
    keys: Iterable[str],
    *,
    ttl: float = TTL,
    resumed: Mapping[str, float] | None = None,
) -> dict[str, JobState]:
    """Every key DONE, one ``committed`` per key (the stored fence), no accepted stale write,
    no acquisition inside a live lease. Returns the records.

    ``resumed`` maps a worker that was frozen to when it was resumed: a reply it was waiting
    for when it froze is handled only then, so its ``acquired``/``renewed`` events carry the
    resume time, not the store's. Those are left out of the lease-window check (the store's
    own tokens and the commit checks still cover them)."""
    histories = workers.histories()
    for node, at in (resumed or {}).items():
        histories[node] = [
            e for e in histories[node] if e["kind"] not in ("acquired", "renewed") or e["at"] < at
        ]
    keys = list(keys)
    records = {}
    for key in keys:
        per_key = {node: [e for e in evs if e.get("key") == key] for node, evs in histories.items()}
        records[key] = await check_invariants(workers.store_url, key, per_key, ttl=ttl)
    strays = {e["key"] for evs in histories.values() for e in of_kind(evs, "committed")}
    assert strays <= set(keys), f"commits for keys never submitted: {strays - set(keys)}"
    return records


async def stop_gracefully(*procs: NodeProcess, timeout: float = 15.0) -> None:
    """SIGTERM each worker; each must exit 0 after saying it stopped."""
    for proc in procs:
        if proc.running:
            proc.signal(signal.SIGTERM)
    for proc in procs:
        code = await proc.exited(timeout)
        assert code == 0, f"worker {proc.name} exited with {code}\n{proc.dump()}"
        assert of_kind(proc.events(), "worker_stopped"), proc.dump()


def keys_of(events: Events, *kinds: str, stage: str | None = None) -> set[str]:
    return {e["key"] for e in of_kind(events, *kinds) if stage is None or e["stage"] == stage}


def in_flight(events: Events) -> set[str]:
    """Keys this worker is streaming for and has not finished or handed back."""
    started = keys_of(events, "stage", stage="call_ai")
    return started - keys_of(events, "committed", "released", "done")


def worker_of(record: JobState) -> str:
    """The worker whose attempt owns ``record`` (owner ids are ``<worker>#<attempt>``)."""
    return (record.owner_id or "").split("#")[0]


def first(events: Events, kind: str, key: str) -> dict[str, Any]:
    found = [e for e in events if e["kind"] == kind and e.get("key") == key]
    assert found, f"no {kind} event for {key}"
    return found[0]


async def wait_until_stopped(proc: NodeProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.state() != "T":
        assert time.monotonic() < deadline, f"{proc.name} never stopped\n{proc.dump()}"
        await asyncio.sleep(0.02)


def sqlite_writable(store_url: str) -> bool:
    """Whether another process can take the SQLite file's write lock right now."""
    conn = sqlite3.connect(store_url.removeprefix("sqlite:///"), timeout=0.2, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


async def freeze(proc: NodeProcess, store_url: str) -> float:
    """SIGSTOP ``proc``; returns when (wall clock). On SQLite, a process frozen inside a write
    transaction would lock every other process out until resumed (SQLite's locking, not
    ai_lease's), which is not the scenario: then it is resumed and frozen again."""
    for _ in range(10):
        proc.signal(signal.SIGSTOP)
        stopped_at = time.time()
        await wait_until_stopped(proc)
        if not store_url.startswith("sqlite") or await asyncio.to_thread(
            sqlite_writable, store_url
        ):
            return stopped_at
        proc.signal(signal.SIGCONT)
        await asyncio.sleep(0.01)
    raise AssertionError(f"{proc.name} held the SQLite write lock at every freeze")


def report(store_url: str, scenario: str, **measured: float) -> None:
    """Print the measured latencies (shown with ``pytest -s``)."""
    backend = store_url.split(":", 1)[0]
    numbers = " ".join(f"{name}={value:.2f}s" for name, value in measured.items())
    print(f"\nWORKERS {backend:<6} {scenario:<16} {numbers}")


async def cli(*args: str, timeout: float = 30.0) -> tuple[int, str, str]:
    """Run ``python -m ai_lease ARGS`` from the repository root (no AI_LEASE_* settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ai_lease",
        *args,
        cwd=REPO_ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def listed_workers(store_url: str) -> dict[str, dict[str, Any]]:
    code, out, err = await cli("--store", store_url, "workers", "--json")
    assert code == 0, f"ai-lease workers exited {code}: {err}"
    return {info["worker_id"]: info for info in map(json.loads, out.splitlines())}


# -- the scenarios -----------------------------------------------------------------------------


async def test_jobs_across_three_workers_run_exactly_once(
    workers: Workers, store: LeaseStore
) -> None:
    """200 instant jobs across 3 workers all end DONE exactly once, and every worker ran some."""
    procs = await asyncio.gather(
        *(workers.start_ready(name, concurrency=4) for name in ("A", "B", "C"))
    )
    keys = [f"job-{i:03d}" for i in range(200)]
    started = time.monotonic()
    await submit(store, keys)
    await wait_all_done(store, keys, workers)
    elapsed = time.monotonic() - started
    await stop_gracefully(*procs)
    records = await assert_done_exactly_once(workers, keys)
    histories = workers.histories()
    for name, events in histories.items():
        assert keys_of(events, "committed"), f"worker {name} ran no job\n{workers.dump()}"
    calls = [e["key"] for events in histories.values() for e in of_kind(events, "call")]
    assert sorted(calls) == keys, "a job's model was called more than once (or never)"
    for key, record in records.items():
        assert record.output == f"{key} by {worker_of(record)}"
    report(workers.store_url, "200 jobs x3", submit_to_all_done=elapsed)


async def test_killed_workers_jobs_finish_elsewhere(workers: Workers, store: LeaseStore) -> None:
    """A worker SIGKILLed mid-job loses its jobs to the other within TTL + sweep of the kill."""
    a, b = await asyncio.gather(
        workers.start_ready("A", concurrency=4, job_seconds=1.5),
        workers.start_ready("B", concurrency=8, job_seconds=1.5),
    )
    keys = [f"kill-{i:02d}" for i in range(12)]
    await submit(store, keys)
    await a.wait_for(in_flight, "A to stream a job", timeout=10)
    a.signal(signal.SIGKILL)
    killed_at = time.time()
    assert await a.exited() == -signal.SIGKILL
    await wait_all_done(store, keys, workers)
    await stop_gracefully(b)
    records = await assert_done_exactly_once(workers, keys)

    orphans = in_flight(a.events())
    assert orphans, f"A held no job when it was killed\n{a.dump()}"
    b_events = b.events()
    delays = []
    for key in orphans:
        assert worker_of(records[key]) == "B", f"{key} finished by {records[key].owner_id}"
        taken = first(b_events, "acquired", key)
        assert "(takeover)" in taken["detail"], taken
        delays.append(taken["at"] - killed_at)
    assert max(delays) <= TTL + SWEEP + SLACK, f"takeovers {delays}s after the kill"
    report(workers.store_url, "sigkill", takeover_after_kill=max(delays))


async def test_paused_worker_commits_nothing_after_takeover(
    workers: Workers, store: LeaseStore
) -> None:
    """A worker SIGSTOPped past its leases' expiry, then resumed, adds no second result."""
    a, b = await asyncio.gather(
        workers.start_ready("A", concurrency=4, job_seconds=1.5),
        workers.start_ready("B", concurrency=4, job_seconds=1.5),
    )
    keys = [f"stop-{i:02d}" for i in range(8)]
    await submit(store, keys)
    held = await a.wait_for(in_flight, "A to stream a job", timeout=10)
    stopped_at = await freeze(a, workers.store_url)
    await wait_all_done(store, keys, workers)
    assert a.state() == "T", "A was resumed before the takeover"
    assert time.time() - stopped_at > TTL, "the jobs finished before A's leases could expire"
    resumed_at = time.time()
    a.signal(signal.SIGCONT)
    await stop_gracefully(a, b)  # every job is DONE: after the resume, A only steps down
    records = await assert_done_exactly_once(workers, keys, resumed={"A": resumed_at})

    a_events = a.events()
    assert held <= in_flight([e for e in a_events if e["at"] <= stopped_at])
    for key in held:
        record = records[key]
        assert worker_of(record) == "B" and record.output.endswith(f" {key} by B")
        mine = [e for e in a_events if e.get("key") == key and e["at"] > stopped_at]
        assert not of_kind(mine, "committed"), f"A committed {key} after its pause"
        for fenced in of_kind(mine, "fenced"):
            assert fenced["token"] < record.token, fenced
    woke = [e for e in a_events if e.get("key") in held and e["at"] > stopped_at]
    report(
        workers.store_url,
        "sigstop",
        frozen_for=min(e["at"] for e in woke) - stopped_at if woke else 0.0,
    )


async def test_sigterm_hands_running_jobs_over_at_once(
    store_url: str, tmp_path: Path, store: LeaseStore
) -> None:
    """SIGTERM: exit 0; jobs past the grace are released and taken over after a poll, not a TTL."""
    ttl = 6.0  # long, so a takeover that waits out the TTL cannot pass for a quick one
    async with Workers(store_url, tmp_path, ttl=ttl, renew=RENEW, sweep=SWEEP) as workers:
        a, b = await asyncio.gather(
            workers.start_ready("A", concurrency=4, job_seconds=3.0, grace=0.5),
            workers.start_ready("B", concurrency=8, job_seconds=0.3),
        )
        keys = [f"term-{i:02d}" for i in range(12)]  # more than B alone can take at once
        await submit(store, keys)
        await a.wait_for(in_flight, "A to stream a job", timeout=10)
        a.signal(signal.SIGTERM)
        assert await a.exited(15) == 0, a.dump()
        await wait_all_done(store, keys, workers)
        await stop_gracefully(b)
        records = await assert_done_exactly_once(workers, keys, ttl=ttl)

        a_events = a.events()
        handed = keys_of(a_events, "released")
        assert handed, f"A released nothing\n{a.dump()}"
        assert handed == keys_of(a_events, "acquired") - keys_of(a_events, "committed")
        delays = []
        for key in handed:
            released = first(a_events, "released", key)
            taken = first(b.events(), "acquired", key)
            assert worker_of(records[key]) == "B"
            delays.append(taken["at"] - released["at"])
        assert max(delays) <= HANDOVER_BOUND, (
            f"released jobs were taken {[round(d, 2) for d in delays]}s after their release "
            f"(bound {HANDOVER_BOUND:g}s, lease TTL {ttl:g}s): the other worker waited for "
            "the key's next scheduled look, not for a poll"
        )
        report(store_url, "sigterm", takeover_after_release=max(delays))


async def test_second_sigterm_stops_a_draining_worker_at_once(
    workers: Workers, store: LeaseStore
) -> None:
    """A second SIGTERM ends a worker draining with a long grace at once; nothing is lost."""
    a = await workers.start_ready("A", concurrency=4, job_seconds=20.0, grace=30.0)
    keys = [f"drain-{i}" for i in range(4)]
    await submit(store, keys)
    await a.wait_for(lambda evs: len(in_flight(evs)) == 4, "A to stream all jobs", timeout=10)
    a.signal(signal.SIGTERM)
    await a.wait_for_event("draining", "A to start draining")
    a.signal(signal.SIGTERM)
    second_at = time.monotonic()
    assert await a.exited(15) == 0, a.dump()
    took = time.monotonic() - second_at
    assert took <= 3.0, f"A took {took:.2f}s to exit after the second signal"
    assert keys_of(a.events(), "released") == set(keys), a.dump()
    b = await workers.start_ready("B", concurrency=4)
    await wait_all_done(store, keys, workers)
    await stop_gracefully(b)
    await assert_done_exactly_once(workers, keys)
    report(workers.store_url, "second sigterm", exit_after_second_signal=took)


async def test_workers_lists_a_live_worker_until_it_leaves(
    workers: Workers, store: LeaseStore, tmp_path: Path
) -> None:
    """`ai-lease workers` lists a running worker with its pid; once it exits, it is gone."""
    a = await workers.start_ready("cli-worker", concurrency=2)
    job_file = tmp_path / "job.toml"
    job_file.write_text('key = "cli-job"\ninput = "cli-job"\nprompt_text = "{{ input }}"\n')
    code, out, err = await cli("--store", workers.store_url, "submit", "--detach", str(job_file))
    assert (code, out.strip()) == (0, "cli-job"), err
    deadline = time.monotonic() + 15
    listed = await listed_workers(workers.store_url)
    while "cli-worker" not in listed:
        assert time.monotonic() < deadline, f"never listed: {listed}\n{a.dump()}"
        await asyncio.sleep(0.2)
        listed = await listed_workers(workers.store_url)
    assert listed["cli-worker"]["pid"] == a.pid
    assert listed["cli-worker"]["concurrency"] == 2
    await wait_all_done(store, ["cli-job"], workers)
    await stop_gracefully(a)
    assert "cli-worker" not in await listed_workers(workers.store_url)
    records = await assert_done_exactly_once(workers, ["cli-job"])
    assert records["cli-job"].output == "cli-job by cli-worker"


async def test_stalled_job_is_recovered_by_another_worker(
    workers: Workers, store: LeaseStore, tmp_path: Path
) -> None:
    """A hung job is recovered by another worker within budget + renewal + TTL + sweep."""
    hang_file = ("--hang-file", str(tmp_path / "hung-once"))
    procs = await asyncio.gather(
        *(workers.start_ready(name, concurrency=2, extra=hang_file) for name in ("A", "B"))
    )
    await submit(store, ["hang-job"])
    await wait_all_done(store, ["hang-job"], workers)
    await stop_gracefully(*procs)
    records = await assert_done_exactly_once(workers, ["hang-job"])

    events = workers.histories()
    zombie = next(name for name, evs in events.items() if of_kind(evs, "hang"))
    rescuer = "B" if zombie == "A" else "A"
    assert of_kind(events[zombie], "stalled"), events[zombie]
    assert worker_of(records["hang-job"]) == rescuer
    taken = first(events[rescuer], "acquired", "hang-job")
    assert "(takeover)" in taken["detail"], taken
    entered = next(e for e in of_kind(events[zombie], "stage") if e["stage"] == "call_ai")
    delay = taken["at"] - entered["at"]
    assert delay <= MNP + RENEW + TTL + SWEEP + SLACK, f"recovered {delay:.2f}s after the hang"
    report(workers.store_url, "stalled", recovered_after_hang=delay)


async def test_killed_owners_job_is_recovered_ahead_of_a_backlog(
    workers: Workers, store: LeaseStore
) -> None:
    """A SIGKILLed owner's job is taken within TTL + sweep, ahead of a 10x-capacity backlog."""
    a = await workers.start_ready("A", concurrency=1, job_seconds=30.0)
    await submit(store, ["orphan"])
    await a.wait_for(in_flight, "A to stream the orphan", timeout=10)
    b = await workers.start_ready("B", concurrency=4, job_seconds=1.0)
    backlog = [f"backlog-{i:02d}" for i in range(40)]  # ~10 s of work for B
    await submit(store, backlog)
    await b.wait_for(lambda evs: len(in_flight(evs)) == 4, "B to fill its slots", timeout=10)
    a.signal(signal.SIGKILL)
    killed_at = time.time()
    assert await a.exited() == -signal.SIGKILL
    await wait_all_done(store, ["orphan"], workers)
    b_events = b.events()
    taken = first(b_events, "acquired", "orphan")
    assert "(takeover)" in taken["detail"], taken
    delay = taken["at"] - killed_at
    before = {e["key"] for e in of_kind(b_events, "committed") if e["at"] <= taken["at"]}
    assert len(before & set(backlog)) < len(backlog), "the backlog ran out before the takeover"
    assert delay <= TTL + SWEEP + SLACK, (
        f"the orphan was taken {delay:.2f}s after its owner was killed "
        f"(bound {TTL + SWEEP + SLACK:g}s), behind {len(backlog) - len(before)} backlog jobs"
    )
    await wait_all_done(store, backlog, workers)
    await stop_gracefully(b)
    await assert_done_exactly_once(workers, ["orphan", *backlog])
    report(workers.store_url, "kill+backlog", takeover_after_kill=delay)
