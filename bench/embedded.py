"""Jobs per second on the embedded store (one SQLite file) from 1, 2 and 4 processes, in one run.

    .venv/bin/python bench/embedded.py                 # 1,2,4 processes, 3 s each, 3 rounds
    .venv/bin/python bench/embedded.py --processes 1,2,4,8 --concurrency 1

Nothing to start: every process opens the same SQLite file (WAL) in a temporary directory.

Each process runs ``Runner.run(Job(...))`` on fresh keys from ``--concurrency`` tasks: the full
single-flight pipeline (acquire, keeper, five stages with an instant scripted provider, fenced
commit), history and tracing off, default timings. One measurement: a fresh file, ``k``
processes forked, each opens its store and runs a few warm-up jobs, then all start together
and run ``--seconds``; jobs/s = all jobs / the longest process's window. Process counts are
interleaved round by round, so a slow patch of the machine hits each alike; medians shown.
The issue names no target here: this bench proposes that adding processes must not lower
throughput (k processes / 1 process >= 1.0), i.e. the file's write lock is not the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from ai_lease import Job, Runner
from ai_lease.run.config import RunConfig
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider

SCALING_TARGET = 1.0
WARMUP_JOBS = 20


async def jobs_for(path: str, tag: str, seconds: float, workers: int, start: Barrier) -> Any:
    """In one process: warm up, wait for the others, run jobs for ``seconds``."""
    store = SQLiteStore(path)
    runner = Runner(
        store,
        provider=ScriptedProvider(["ok"]),
        config=RunConfig(record_history=False, trace=False),
    )

    async def one(key: str) -> None:
        record = await runner.run(Job(key, input="x", prompt_text="{{ input }}"))
        if record.output != "ok":
            raise RuntimeError(f"bench: {key} ended with {record!r}")

    for i in range(WARMUP_JOBS):
        await one(f"warm:{tag}:{i}")
    await asyncio.to_thread(start.wait)
    end, counts = time.perf_counter() + seconds, [0] * workers

    async def worker(w: int) -> None:
        while time.perf_counter() < end:
            await one(f"{tag}:{w}:{counts[w]}")
            counts[w] += 1

    t0, c0 = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        for w in range(workers):
            tg.create_task(worker(w))
    window, cpu = time.perf_counter() - t0, time.process_time() - c0
    await store.aclose()
    return sum(counts), window, cpu


def child(path: str, tag: str, seconds: float, workers: int, start: Barrier, out: Any) -> None:
    out.put(asyncio.run(jobs_for(path, tag, seconds, workers, start)))


def measure(k: int, args: argparse.Namespace, tmp: str) -> dict[str, float]:
    """One measurement with ``k`` processes on a fresh file."""
    ctx = multiprocessing.get_context("fork")
    path, tag = str(Path(tmp) / f"{uuid.uuid4().hex[:8]}.db"), uuid.uuid4().hex[:6]
    start, out = ctx.Barrier(k), ctx.Queue()
    procs = [
        ctx.Process(
            target=child, args=(path, f"{tag}-{i}", args.seconds, args.concurrency, start, out)
        )
        for i in range(k)
    ]
    for proc in procs:
        proc.start()
    got = [out.get(timeout=60 + args.seconds) for _ in procs]
    for proc in procs:
        proc.join()
    with sqlite3.connect(path) as conn:  # every job counted must be DONE in the file
        done = conn.execute("SELECT count(*) FROM ai_lease_jobs WHERE status = 'DONE'").fetchone()
    jobs = sum(n for n, _, _ in got)
    if done[0] != jobs + k * WARMUP_JOBS:
        raise RuntimeError(f"bench: {done[0]} DONE records for {jobs} jobs counted")
    return {
        "rate": jobs / max(w for _, w, _ in got),
        "cpu_us": sum(c for _, _, c in got) / jobs * 1e6,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--processes", default="1,2,4", help="process counts to compare")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent jobs per process")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    args = p.parse_args()
    counts = [int(x) for x in args.processes.split(",")]
    print(
        f"embedded: SQLite, {args.processes} processes x {args.concurrency} concurrent jobs, "
        f"{args.seconds:g} s x {args.rounds} rounds; Python {sys.version.split()[0]}, "
        f"SQLite {sqlite3.sqlite_version}"
    )
    res: dict[int, dict[str, list[float]]] = {k: {"rate": [], "cpu_us": []} for k in counts}
    with tempfile.TemporaryDirectory(prefix="ai_lease-bench-") as tmp:
        for _ in range(args.rounds):
            for k in counts:
                for key, value in measure(k, args, tmp).items():
                    res[k][key].append(value)
    med = {k: {key: statistics.median(v) for key, v in r.items()} for k, r in res.items()}
    base = med[counts[0]]["rate"]
    print(
        f"\n{'processes':>9} {'jobs/s':>8} {'CPU/job µs':>11} {'vs ' + str(counts[0]):>6}  rounds"
    )
    for k in counts:
        rounds = " ".join(f"{x:.0f}" for x in res[k]["rate"])
        print(
            f"{k:>9} {med[k]['rate']:8.0f} {med[k]['cpu_us']:11.0f} "
            f"{med[k]['rate'] / base:6.2f}  {rounds}"
        )
    print()
    for k in counts:
        print(f"RESULT sqlite_{k}proc_jobs_per_s {med[k]['rate']:.0f}")
        print(f"RESULT sqlite_{k}proc_cpu_us_per_job {med[k]['cpu_us']:.0f}")
    verdicts = []
    for k in counts[1:]:
        ratio = med[k]["rate"] / base
        print(f"RESULT ratio_sqlite_{k}proc_vs_{counts[0]}proc {ratio:.3f}")
        name = f"sqlite_{k}proc_vs_{counts[0]}proc>={SCALING_TARGET:g} (proposed) ({ratio:.3f})"
        verdicts.append((ratio >= SCALING_TARGET, name))
    print()
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
