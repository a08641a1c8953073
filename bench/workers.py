"""Jobs per second and CPU per job through real `ai-lease worker` processes, in one run.

    .venv/bin/python bench/workers.py             # SQLite, Redis, PostgreSQL; asyncio, uvloop
    .venv/bin/python bench/workers.py --jobs 300 --rounds 5 --workers 1,2 --loops asyncio
    .venv/bin/python bench/workers.py --isolation task,process --loops asyncio --workers 1

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary and PostgreSQL's server binaries). It starts its own ``redis-server``
and its own PostgreSQL cluster (tests/harness; fsync on unless ``--pg-fsync off``,
bench/_pg_stats.py) and writes its SQLite files to a temporary directory, so nothing
already running is touched.

Each worker is the ``ai-lease worker`` command as a user starts it (the console script,
its settings file, the default lease timings, history and tracing on, its log lines on
stderr, here to a file) with ``--loop`` asyncio or uvloop. The model is either

- ``--model sse`` (default): ``openai-compatible`` against a loopback OpenAI-compatible server
  (tests/harness/sse_server.py, in this process) that streams a four-chunk answer at once;
- ``--model local``: the offline ``local-extractive`` provider (it paces its words at 20 ms, so
  jobs/s then measure that pace more than ai_lease).

One measurement: a fresh store (new SQLite file, or Redis emptied); ``k`` workers started,
then warmed up with ``--concurrency`` throwaway jobs each (imports, templates, scripts and
connections off the clock); the workers paused (SIGSTOP); ``--jobs`` jobs submitted; the
workers' CPU read (/proc) and the clock started as they are resumed (SIGCONT); the run ends
at the last job's commit (the DONE records' ``updated_at``). Every store x loop x worker-count
combination runs once per round, interleaved, so a slow patch of the machine hits each alike;
the table shows medians of jobs/s, of the workers' CPU per job (all worker processes
together) and of redis-server's CPU per job. On Redis it also counts, from ``INFO
commandstats``, the commands the workers sent per job (the bench's own reads of the records
left out): what one queued job costs in round trips, sweeps and heartbeats included; on
PostgreSQL the same from ``pg_stat_statements`` (top-level statements: one round trip each),
and the server's CPU is the postmaster's and its backends'.

``--isolation task,process`` adds a column: ``process`` runs each job's stages in the
worker's warm child processes (``ai-lease worker --isolation process``); worker CPU then
counts the children too, and the report gives process isolation's overhead per job
against ``task`` (CPU, and wall time from throughput: ``1/jobs_per_s`` difference).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

import _pg_stats
from _pair import client_for
from _redis_stats import Calls, snapshot

from ai_lease import LeaseStore, Status, open_store
from ai_lease.job import Job
from ai_lease.run.runner import Runner
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer
from tests.harness.sse_server import Request, Response, SSEServer, chat_chunks, sse

STORES = ("sqlite", "redis", "postgres")
ISOLATIONS = ("task", "process")
LOOPS = ("asyncio", "uvloop")
DONE_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
TICKS = os.sysconf("SC_CLK_TCK")
ANSWER = sse(*chat_chunks(["One ", "short ", "answer", "."], usage=(12, 4)))
PROMPT = "Summarize: {{ input }}"


def answer(request: Request) -> Response:
    return ANSWER


def worker_command() -> list[str]:
    """``ai-lease`` as installed beside this interpreter (else ``python -m ai_lease``)."""
    script = Path(sys.executable).with_name("ai-lease")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ai_lease"]


def settings_file(directory: Path, url: str, args: argparse.Namespace, base_url: str) -> Path:
    provider = (
        f'name = "openai-compatible"\nmodel = "m"\nbase_url = "{base_url}"\n'
        + (f'http = "{args.http}"\n' if args.http != "auto" else "")
        if args.model == "sse"
        else 'name = "local-extractive"\n'
    )
    path = directory / "ai-lease.toml"
    path.write_text(f'[store]\nurl = "{url}"\n\n[provider]\n{provider}')
    return path


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a child that has gone since it was listed
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICKS


def with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and every live process below them (a process worker's children)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = list(pids), list(pids)
    while todo:
        below = parents.get(todo.pop(), [])
        found += below
        todo += below
    return found


async def submit(store: LeaseStore, keys: list[str]) -> None:
    runner = Runner(store)
    for key in keys:
        await runner.submit(Job(key, input=f"{key}. A sentence to keep.", prompt_text=PROMPT))


async def wait_done(
    store: LeaseStore, keys: list[str], procs: list[asyncio.subprocess.Process]
) -> tuple[float, int]:
    """Until every key is DONE; returns the last commit's time (the records' clock) and how
    many reads it took."""
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
        if any(proc.returncode is not None for proc in procs):
            raise RuntimeError("a worker exited before the jobs were done")
        await asyncio.sleep(0.02)
    return last, reads


@dataclass
class Sample:
    """One measurement: throughput, and what each job cost."""

    jobs_per_s: float
    worker_cpu_ms: float  # CPU of all worker processes, per job
    server_cpu_ms: float  # CPU of redis-server / PostgreSQL, per job (0 on SQLite)
    sent: dict[str, float]  # commands / statements the workers sent, per job ({} on SQLite)


@dataclass
class Variant:
    store: str
    loop: str
    workers: int
    isolation: str = "task"

    @property
    def name(self) -> str:
        base = f"{self.store}_{self.loop}_{self.workers}"
        return base if self.isolation == "task" else f"{base}_{self.isolation}"


class Bench:
    def __init__(
        self, args: argparse.Namespace, redis_server: RedisServer, pg: PostgresServer, tmp: Path
    ) -> None:
        self.args, self.redis_server, self.pg, self.tmp = args, redis_server, pg, tmp
        self.model: SSEServer | None = None

    def fresh_url(self, store: str, directory: Path) -> str:
        """A store with no job yet: Redis emptied, PostgreSQL's schemas dropped, a new file."""
        if store == "redis":
            self.redis_server.flushall()
            return self.redis_server.url
        if store == "postgres":
            self.pg.terminate_backends()
            self.pg.reset_all()
            return self.pg.url
        return f"sqlite:///{directory / 'bench.db'}"

    def server_pid(self, store: str) -> int | None:
        return {"redis": self.redis_server.pid, "postgres": self.pg.pid}.get(store)

    async def counts(self, store: str, admin: Any) -> Calls:
        if store == "postgres":
            return _pg_stats.snapshot(self.pg)
        return await snapshot(admin) if admin is not None else Calls()

    async def measure(self, variant: Variant, directory: Path) -> Sample:
        """``variant.workers`` workers, ``--jobs`` jobs, from resume to the last commit."""
        args = self.args
        url = self.fresh_url(variant.store, directory)
        base_url = self.model.base_url if self.model else ""
        config = settings_file(directory, url, args, base_url)
        store = open_store(url, op_timeout=2.0)
        procs: list[asyncio.subprocess.Process] = []
        try:
            warm = [f"warm-{i:03d}" for i in range(variant.workers * args.concurrency)]
            await submit(store, warm)
            for i in range(variant.workers):
                procs.append(await self.start_worker(config, variant, directory, i))
            await wait_done(store, warm, procs)  # (the warm-up's reads are not counted)
            for proc in procs:
                proc.send_signal(signal.SIGSTOP)
            keys = [f"bench-{i:05d}" for i in range(args.jobs)]
            await submit(store, keys)
            pids = with_descendants([proc.pid for proc in procs])
            admin = client_for(url) if variant.store == "redis" else None
            before = await self.counts(variant.store, admin)
            cpu0 = cpu_seconds(pids)
            server0 = self.server_cpu(variant.store)
            started = time.time()
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
            ended, reads = await wait_done(store, keys, procs)
            cpu = cpu_seconds(pids) - cpu0
            server_cpu = self.server_cpu(variant.store) - server0
            sent = await self.sent(variant.store, admin, before, reads)
        finally:
            await self.stop(procs, directory)
            await store.aclose()
        n = args.jobs
        per_job = {name: count / n for name, count in sent.items()}
        return Sample(n / (ended - started), 1000 * cpu / n, 1000 * server_cpu / n, per_job)

    def server_cpu(self, store: str) -> float:
        if store == "postgres":
            return _pg_stats.server_cpu_s(self.pg)
        pid = self.server_pid(store)
        return cpu_seconds([pid]) if pid is not None else 0.0

    async def sent(self, store: str, admin: Any, before: Calls, reads: int) -> dict[str, int]:
        """The commands sent since ``before``, less the bench's ``reads`` (one EVALSHA each
        on Redis, one SELECT on PostgreSQL)."""
        if store == "sqlite":
            return {}
        calls = Calls()
        calls.add(before, await self.counts(store, admin))
        if admin is not None:
            await admin.aclose()
        sent = calls.sent()
        read = "select" if store == "postgres" else "evalsha"
        sent[read] = sent.get(read, 0) - reads
        return {name: count for name, count in sent.items() if count}

    async def start_worker(
        self, config: Path, variant: Variant, directory: Path, i: int
    ) -> asyncio.subprocess.Process:
        log = (directory / f"worker-{i}.log").open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
        with log:
            return await asyncio.create_subprocess_exec(
                *worker_command(),
                *("--config", str(config), "worker", "--loop", variant.loop),
                *("--concurrency", str(self.args.concurrency), "--worker-id", f"w{i}"),
                *("--sweep-interval", str(self.args.sweep)),
                *("--isolation", variant.isolation),
                cwd=directory,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )

    async def stop(self, procs: list[asyncio.subprocess.Process], directory: Path) -> None:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        failures: list[str] = []
        for i, proc in enumerate(procs):
            try:
                code = await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                code = await proc.wait()
            if code != 0:
                lines = (directory / f"worker-{i}.log").read_text(errors="replace").splitlines()
                errors = [line.strip(" |") for line in lines if "Error" in line]
                why = f": {errors[-1]}" if errors else ""
                failures.append(f"worker w{i} exited {code}{why}")
        if failures:  # the one that says why first (the others were stopped after it)
            raise RuntimeError(sorted(failures, key=lambda f: ":" not in f)[0])

    async def run(self, variants: list[Variant]) -> dict[str, list[Sample] | str]:
        this = asyncio.current_task()
        assert this is not None
        # SIGTERM unwinds like Ctrl-C: every worker process is stopped on the way out.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
        results: dict[str, list[Sample] | str] = {v.name: [] for v in variants}
        async with SSEServer(responder=answer) as model:
            self.model = model
            for r in range(self.args.rounds):
                for variant in variants:
                    samples = results[variant.name]
                    if isinstance(samples, str):
                        continue  # failed once: not tried again
                    directory = self.tmp / f"{variant.name}-{r}"
                    directory.mkdir()
                    try:
                        sample = await self.measure(variant, directory)
                    except RuntimeError as exc:
                        results[variant.name] = f"failed: {str(exc).strip().splitlines()[-1]}"
                        print(f"  round {r + 1}: {variant.name}: {results[variant.name]}")
                        continue
                    samples.append(sample)
                    print(
                        f"  round {r + 1}: {variant.store:<8} {variant.loop:<7} "
                        f"{variant.isolation:<7} "
                        f"{variant.workers} worker(s) {sample.jobs_per_s:6.0f} jobs/s  "
                        f"worker CPU {sample.worker_cpu_ms:.2f} ms/job"
                        + (
                            f"  server CPU {sample.server_cpu_ms:.2f} ms/job, sent per job "
                            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(sample.sent.items()))
                            if variant.store != "sqlite"
                            else ""
                        ),
                        flush=True,
                    )
        return results


def med(samples: list[Sample], field: str) -> float:
    return float(statistics.median(getattr(s, field) for s in samples))


def report(variants: list[Variant], results: dict[str, list[Sample] | str]) -> None:
    print(
        f"\n{'store':<8} {'loop':<8} {'isolation':<9} {'workers':>7} {'jobs/s':>7} "
        f"{'worker CPU':>11} {'server CPU':>10}   jobs/s per round"
    )
    for v in variants:
        samples = results[v.name]
        if isinstance(samples, str):
            print(f"{v.store:<8} {v.loop:<8} {v.isolation:<9} {v.workers:>7}   {samples}")
            continue
        redis_cpu = f"{med(samples, 'server_cpu_ms'):>7.2f} ms" if v.store != "sqlite" else "-"
        each = " / ".join(f"{s.jobs_per_s:.0f}" for s in samples)
        print(
            f"{v.store:<8} {v.loop:<8} {v.isolation:<9} {v.workers:>7} "
            f"{med(samples, 'jobs_per_s'):>7.0f} "
            f"{med(samples, 'worker_cpu_ms'):>8.2f} ms {redis_cpu:>10}   {each}"
        )
    print("(medians; worker CPU: all worker processes together, per job)\n")
    for v in variants:
        samples = results[v.name]
        if isinstance(samples, str):
            print(f"RESULT {v.name}_failed 1")
            continue
        print(f"RESULT {v.name}_jobs_per_s {med(samples, 'jobs_per_s'):.0f}")
        print(f"RESULT {v.name}_worker_cpu_ms_per_job {med(samples, 'worker_cpu_ms'):.3f}")
        if v.store != "sqlite":
            server, sent = ("redis", "commands") if v.store == "redis" else ("pg", "statements")
            print(f"RESULT {v.name}_{server}_cpu_ms_per_job {med(samples, 'server_cpu_ms'):.3f}")
            total = statistics.median(sum(s.sent.values()) for s in samples)
            print(f"RESULT {v.name}_{server}_{sent}_per_job {total:.3f}")
    isolation_overhead(variants, results)
    for v in variants:  # uvloop against asyncio, same store and worker count
        if v.loop != "uvloop" or v.isolation != "task":
            continue
        fast, base = results[v.name], results.get(f"{v.store}_asyncio_{v.workers}")
        if isinstance(fast, list) and isinstance(base, list) and fast and base:
            speed = med(fast, "jobs_per_s") / med(base, "jobs_per_s")
            cpu = med(fast, "worker_cpu_ms") / med(base, "worker_cpu_ms")
            print(f"RESULT {v.store}_{v.workers}_uvloop_vs_asyncio_jobs_per_s {speed:.3f}")
            print(f"RESULT {v.store}_{v.workers}_uvloop_vs_asyncio_cpu_per_job {cpu:.3f}")


def isolation_overhead(variants: list[Variant], results: dict[str, list[Sample] | str]) -> None:
    """Process isolation's cost per job against task isolation, same store, loop, workers:
    CPU (all processes) and wall time (``1000 / jobs_per_s`` difference, ms)."""
    for v in variants:
        if v.isolation != "process":
            continue
        task = Variant(v.store, v.loop, v.workers)
        proc, base = results[v.name], results.get(task.name)
        if not (isinstance(proc, list) and isinstance(base, list) and proc and base):
            continue
        cpu = med(proc, "worker_cpu_ms") - med(base, "worker_cpu_ms")
        wall = 1000 / med(proc, "jobs_per_s") - 1000 / med(base, "jobs_per_s")
        print(f"RESULT {task.name}_process_overhead_cpu_ms_per_job {cpu:.3f}")
        print(f"RESULT {task.name}_process_overhead_wall_ms_per_job {wall:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--jobs", type=int, default=500, help="jobs per measurement")
    p.add_argument(
        "--workers",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1, 2],
        help="worker process counts, comma-separated",
    )
    p.add_argument(
        "--stores", default=",".join(STORES), help="comma-separated: sqlite,redis,postgres"
    )
    p.add_argument("--pg-fsync", choices=["on", "off"], default="on", help="the cluster's fsync")
    p.add_argument("--loops", default=",".join(LOOPS), help="comma-separated: asyncio,uvloop")
    p.add_argument(
        "--isolation", default="task", help="comma-separated: task,process (worker --isolation)"
    )
    p.add_argument("--model", choices=["sse", "local"], default="sse", help="see above")
    p.add_argument(
        "--http",
        default="auto",
        help="the openai-compatible provider's http setting (auto: not set, the default)",
    )
    p.add_argument("--concurrency", type=int, default=4, help="jobs at once per worker")
    p.add_argument("--sweep", type=float, default=1.0, help="worker --sweep-interval")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    args = p.parse_args()
    loops = args.loops.split(",")
    if "uvloop" in loops and importlib.util.find_spec("uvloop") is None:
        print("uvloop is not installed: measuring asyncio only", file=sys.stderr)
        loops.remove("uvloop")
    variants = [
        Variant(store, loop, k, isolation)
        for store in args.stores.split(",")
        for loop in loops
        for k in args.workers
        for isolation in args.isolation.split(",")
    ]
    print(
        f"workers: {args.jobs} jobs through `ai-lease worker` x {args.workers} "
        f"(concurrency {args.concurrency} each, sweep {args.sweep:g}s, model {args.model}, "
        f"http {args.http}), "
        f"loops {loops}, {args.rounds} rounds; Python {sys.version.split()[0]}, "
        f"redis-py {redis.__version__}; PostgreSQL fsync {args.pg_fsync}"
    )
    pg = _pg_stats.cluster(fsync=args.pg_fsync == "on")
    try:
        with RedisServer() as server, tempfile.TemporaryDirectory(prefix="ai_lease-bench-") as tmp:
            try:
                results = asyncio.run(Bench(args, server, pg, Path(tmp)).run(variants))
            except (asyncio.CancelledError, KeyboardInterrupt):
                print("interrupted: worker processes and the servers stopped", file=sys.stderr)
                return 1
    finally:
        pg.close()
    report(variants, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
