"""Jobs per second through 1, 2 and 4 worker processes, on SQLite and on Redis, in one run.

    .venv/bin/python bench/workers.py                  # 1000 jobs, 3 rounds, 1/2/4 workers
    .venv/bin/python bench/workers.py --jobs 300 --rounds 5 --workers 1,2,4,8

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary). It starts its own ``redis-server`` (tests/harness) and writes its
SQLite files to a temporary directory, so nothing already running is touched.

Each worker is a real OS process (``tests/harness/worker_proc.py``: a ``Runner`` and a
``Worker`` as ``ai-lease worker`` builds them, with fast lease timings) whose model
answers at once (an instant scripted provider), so what is measured is ai_lease's own cost
per job: discovering it in the queue, competing for it, acquiring, running the five stages,
committing, and taking it off the schedule.

One measurement: a fresh store (new SQLite file, or Redis emptied); ``k`` workers started,
connected, warmed up with 3 throwaway jobs each and held back (``--go-file``); ``--jobs``
jobs submitted; the go file touched (the clock starts; workers notice within 20 ms); the
run ends at the last job's commit (the DONE records' ``updated_at``, store clock).
Store × worker-count combinations are interleaved round by round, so a slow patch of the
machine hits each alike; the table shows medians, with the CPU each job cost the workers
(and redis-server) and, on Redis, how many lease and queue operations each job took.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from ai_lease import LeaseStore, Status, open_store
from ai_lease.job import Job
from ai_lease.runner import Runner
from tests.harness.redis_server import RedisServer
from tests.harness.worker_proc import Workers

STORES = ("sqlite", "redis")
DONE_TIMEOUT_S = 300.0
LOGGED = "acquired,committed"  # kept small: the history file is written on the measured path
OPS = ("evalsha", "eval", "zadd", "zrem", "zrangebyscore")
TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_JOBS = 3  # per worker, before the clock starts (first-use costs)


async def submit(store: LeaseStore, keys: list[str]) -> None:
    runner = Runner(store)
    for key in keys:
        await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))


async def wait_done(store: LeaseStore, keys: list[str]) -> tuple[float, int]:
    """Until every key is DONE; returns the last commit's time (store clock) and how many
    reads this took."""
    deadline = time.monotonic() + DONE_TIMEOUT_S
    i, last, reads = 0, 0.0, 0
    while i < len(keys):  # workers take the longest-due first: scan forward from the first gap
        record = await store.get(keys[i])
        reads += 1
        if record is not None and record.status is Status.FAILED:
            raise RuntimeError(f"{keys[i]} FAILED: {record.last_error}")
        if record is not None and record.status is Status.DONE:
            last = max(last, record.updated_at)
            i += 1
            continue
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(keys) - i} jobs not DONE after {DONE_TIMEOUT_S:g}s")
        await asyncio.sleep(0.05)
    return last, reads


def store_ops(client: redis.Redis | None) -> int:
    """Lease and queue operations the Redis server has served so far (0 for SQLite): one
    EVALSHA per lease operation (get, acquire, commit…), ZADD/ZREM per reschedule, one
    ZRANGEBYSCORE per look at the queue. (Commands run inside scripts are not among these.)"""
    if client is None:
        return 0
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in OPS)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICKS


@dataclass
class Sample:
    """One measurement: throughput, and what each job cost."""

    jobs_per_s: float
    ops_per_job: float  # Redis lease + queue operations (0 on SQLite)
    worker_cpu_ms: float  # CPU of all worker processes, per job
    server_cpu_ms: float  # CPU of redis-server, per job (0 on SQLite)


async def measure(
    url: str, directory: Path, n_workers: int, args: argparse.Namespace, server: RedisServer | None
) -> Sample:
    """One store, ``n_workers`` workers, ``--jobs`` jobs, from go to the last commit."""
    keys = [f"bench-{i:05d}" for i in range(args.jobs)]
    store = open_store(url, op_timeout=2.0)
    admin = redis.Redis.from_url(server.url) if server else None
    async with Workers(url, directory, sweep=args.sweep) as workers:
        procs = await asyncio.gather(
            *(
                workers.start_ready(
                    f"w{i}",
                    concurrency=args.concurrency,
                    wait_for_go=True,
                    extra=("--log-kinds", LOGGED, "--warmup", str(WARMUP_JOBS)),
                )
                for i in range(n_workers)
            )
        )
        pids = [proc.pid for proc in procs]
        try:
            await submit(store, keys)
            ops0, cpu0 = store_ops(admin), cpu_seconds(pids)
            server0 = cpu_seconds([server.pid]) if server else 0.0
            started = time.time()
            workers.go()
            ended, reads = await wait_done(store, keys)
            ops = store_ops(admin) - ops0 - (reads if admin else 0)  # not our own reads
            cpu = cpu_seconds(pids) - cpu0
            server_cpu = cpu_seconds([server.pid]) - server0 if server else 0.0
            for proc in procs:
                proc.signal(signal.SIGTERM)
            for proc in procs:
                code = await proc.exited(30)
                if code != 0:
                    raise RuntimeError(f"worker {proc.name} exited {code}\n{proc.dump()}")
        finally:
            await store.aclose()
            if admin is not None:
                admin.close()
    n = args.jobs
    return Sample(n / (ended - started), ops / n, 1000 * cpu / n, 1000 * server_cpu / n)


Results = dict[tuple[str, int], list[Sample]]


async def run(args: argparse.Namespace, server: RedisServer, tmp: Path) -> Results:
    this = asyncio.current_task()
    assert this is not None
    # SIGTERM unwinds like Ctrl-C: every worker process is killed on the way out.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
    results: Results = {(s, k): [] for s in STORES for k in args.workers}
    for r in range(args.rounds):
        for (backend, k), samples in results.items():
            directory = tmp / f"{backend}-{k}-{r}"
            directory.mkdir()
            if backend == "redis":
                server.flushall()
                sample = await measure(server.url, directory, k, args, server)
            else:
                sample = await measure(
                    f"sqlite:///{directory / 'bench.db'}", directory, k, args, None
                )
            samples.append(sample)
            print(
                f"  round {r + 1}: {backend:<6} {k} worker(s) {sample.jobs_per_s:6.0f} jobs/s  "
                f"worker CPU {sample.worker_cpu_ms:.2f} ms/job"
                + (f"  {sample.ops_per_job:.2f} store ops/job" if backend == "redis" else ""),
                flush=True,
            )
    return results


def med(samples: list[Sample], field: str) -> float:
    return float(statistics.median(getattr(s, field) for s in samples))


def report(results: Results, args: argparse.Namespace) -> None:
    first = args.workers[0]
    print(
        f"\n{'store':<7} {'workers':>7} {'jobs/s':>7} {'vs ' + str(first):>6} "
        f"{'worker CPU':>11} {'redis CPU':>10} {'ops/job':>8}   jobs/s per round"
    )
    for backend in STORES:
        base = med(results[(backend, first)], "jobs_per_s")
        for k in args.workers:
            samples = results[(backend, k)]
            rate = med(samples, "jobs_per_s")
            redis_cells = (
                f"{med(samples, 'server_cpu_ms'):>7.2f} ms {med(samples, 'ops_per_job'):>8.2f}"
                if backend == "redis"
                else f"{'-':>10} {'-':>8}"
            )
            each = " / ".join(f"{s.jobs_per_s:.0f}" for s in samples)
            print(
                f"{backend:<7} {k:>7} {rate:>7.0f} {rate / base:>5.2f}x "
                f"{med(samples, 'worker_cpu_ms'):>8.2f} ms {redis_cells}   {each}"
            )
    print(
        "(medians; CPU per job: all worker processes together, and redis-server; ops/job:\n"
        " Redis lease + queue operations per job, the harness's own reads excluded)\n"
    )
    for backend in STORES:
        base = med(results[(backend, first)], "jobs_per_s")
        for k in args.workers:
            samples = results[(backend, k)]
            rate = med(samples, "jobs_per_s")
            print(f"RESULT {backend}_{k}_workers_jobs_per_s {rate:.0f}")
            if k != first:
                print(f"RESULT {backend}_{k}_workers_vs_{first} {rate / base:.3f}")
            print(
                f"RESULT {backend}_{k}_workers_cpu_ms_per_job {med(samples, 'worker_cpu_ms'):.3f}"
            )
            if backend == "redis":
                print(
                    f"RESULT redis_{k}_workers_store_ops_per_job {med(samples, 'ops_per_job'):.2f}"
                )
    for k in args.workers:
        ratio = med(results[("redis", k)], "jobs_per_s") / med(results[("sqlite", k)], "jobs_per_s")
        print(f"RESULT redis_vs_sqlite_{k}_workers {ratio:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--jobs", type=int, default=1000, help="jobs per measurement")
    p.add_argument(
        "--workers",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1, 2, 4],
        help="worker process counts, comma-separated (the first is the baseline)",
    )
    p.add_argument("--concurrency", type=int, default=4, help="jobs at once per worker")
    p.add_argument("--sweep", type=float, default=0.05, help="seconds between queue looks")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    args = p.parse_args()
    print(
        f"workers: {args.jobs} instant jobs through {args.workers} worker processes "
        f"(concurrency {args.concurrency} each, sweep {args.sweep:g}s), {args.rounds} rounds; "
        f"Python {sys.version.split()[0]}, redis-py {redis.__version__}"
    )
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="ai_lease-bench-") as tmp:
        try:
            results = asyncio.run(run(args, server, Path(tmp)))
        except (asyncio.CancelledError, KeyboardInterrupt):
            print("interrupted: worker processes and redis-server stopped", file=sys.stderr)
            return 1
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
