"""ai_lease beside saq, arq (Redis) and pgqueuer (PostgreSQL): one worker process, concurrency
32, the same no-op job, on the same redis-server and the same PostgreSQL cluster, in one run.

    .venv/bin/python bench/peers.py --setup   # once: bench/.venv-peers, saq arq pgqueuer
    .venv/bin/python bench/peers.py           # 2,000 jobs, -c 32, 3 interleaved rounds

Run from the repository root in the dev environment (needs ``redis-server`` and PostgreSQL's
server binaries, as bench/workers.py). The peers install from the package index into their
own venv, ``bench/.venv-peers`` (``--peers-venv``; git ignores it), never into ai_lease's
dependencies; ``--setup`` creates it (``pip install saq arq pgqueuer asyncpg 'typer<0.20'``).
Their worker side is bench/_peers_app.py, run by each peer's own console script (``saq``,
``arq``, ``pgq run``).

ai_lease runs as ``ai-lease worker -c 32`` (the console script, default timings, ``--loop``
asyncio unless ``--loop uvloop``). Its provider is ``openai-compatible`` against a loopback
OpenAI-compatible server (a child process of the bench's) that streams a four-chunk answer at
once (as bench/workers.py ``--model sse``): the offline ``local-extractive`` provider paces
its words at 20 ms and has no documented setting to answer at once. So an ai_lease job is one
loopback model call (worker CPU includes reading it), a peer's job a no-op function: the peers get
the lighter job. The peers run as shipped: saq, arq on asyncio; ``pgq run`` on uvloop (it
picks uvloop when installed, and pgqueuer installs it).

One measurement, the same for every system: a fresh store (Redis flushed; ai_lease's schemas
dropped and pgqueuer's tables truncated); the worker started and warmed up with 32 throwaway
jobs (imports, scripts, connections off the clock); the worker paused (SIGSTOP); 2,000 jobs
enqueued one call each (ai_lease: ``Runner.submit``); the worker resumed (SIGCONT) and the
clock started; the run ends at the last job's completion as the system records it (ai_lease:
the DONE records' ``updated_at``; saq: ``job.completed``; arq: the result's ``finish_time``;
pgqueuer: its log's ``successful`` row), read after the run. The bench waits by polling one
cheap read every 20 ms (a ZSCORE / ZCARD; a ``count(*)`` on its own PostgreSQL connection,
whose backend's CPU is left out); those reads are left out of the command counts.

Per job: worker CPU (/proc: the worker process and its children, from resume to the end);
server CPU (redis-server's, or the postmaster's and its backends', those that exited
included) and Redis commands (``INFO commandstats``: every command the server ran, those
inside scripts and MULTI blocks included, as the issue counts them; ai_lease's round trips
apart; PostgreSQL: top-level statements from ``pg_stat_statements``), both for the whole job:
its enqueue and its run. Systems are interleaved within each round (``--rounds``, medians).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
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
from _peers_report import report
from _redis_stats import Calls, snapshot
from workers import PROMPT, answer, cpu_seconds, settings_file, with_descendants, worker_command

from ai_lease import open_store
from ai_lease.job import Job
from ai_lease.run.runner import Runner
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer
from tests.harness.sse_server import SSEServer

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SYSTEMS = ("ai_lease_redis", "saq", "arq", "ai_lease_postgres", "pgqueuer")
POSTGRES = frozenset({"ai_lease_postgres", "pgqueuer"})
TIMEOUT_S = 300.0
POLL_S = 0.02
TICKS = os.sysconf("SC_CLK_TCK")
COUNTS_KEY = "{ai_lease:queue}:counts"  # the per-status counts the job scripts keep
# typer < 0.20: pgqueuer 1.6's `pgq run` fails on newer typer ('str' object has no attribute
# 'name' in its --log-level parser).
PEER_PACKAGES = ("saq", "arq", "pgqueuer", "asyncpg", "typer<0.20")


def signal_if_alive(pid: int, sig: int) -> None:
    """Signal ``pid`` unless it has exited since it was listed (a short-lived child of the
    worker, gone between the listing and the signal)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@dataclass
class Sample:
    jobs_per_s: float
    worker_us: float  # worker process + children CPU, per job (run phase)
    server_us: float  # server CPU per job, enqueue + run
    server_run_us: float  # server CPU per job, run phase only
    commands: float  # commands (Redis) / statements (PostgreSQL) per job, enqueue + run
    commands_run: float  # the same, run phase only
    per_command: dict[str, float]  # enqueue + run, per job, by name
    round_trips: float  # ai_lease on Redis: the commands clients sent (scripts' inner ones out)


def _serve_model(conn: Any) -> None:
    """In a child process: the loopback model, its URL sent back, until the parent says stop
    (so its CPU is in no column, and a busy bench process cannot slow the answers)."""

    async def serve() -> None:
        async with SSEServer(responder=answer) as model:
            conn.send(model.base_url)
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    asyncio.run(serve())


def pg_server_cpu_s(server: PostgresServer, leave_out: int | None) -> float:
    """The postmaster's CPU with that of its exited backends (cutime / cstime) and every live
    backend's, less the bench's own polling backend ``leave_out``."""
    total = 0.0
    stat = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    total += sum(int(x) for x in stat[11:15]) / TICKS
    children = [p for p in with_descendants([server.pid]) if p != server.pid]
    total += cpu_seconds([p for p in children if p != leave_out])
    return total


class Peers:
    def __init__(self, args: argparse.Namespace, rs: RedisServer, pg: PostgresServer) -> None:
        self.args, self.rs, self.pg = args, rs, pg
        self.model_url = ""
        self.python = str(Path(args.peers_venv) / "bin" / "python")
        self.admin: Any = None  # redis-py client (polls, commandstats)
        self.poll_conn: Any = None  # psycopg async connection (polls)
        self.poll_pid: int | None = None
        self.polls = 0

    # -- per system ----------------------------------------------------------------------------
    def env(self, system: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
        env.pop("PYTHONPATH", None)
        return (
            env
            | {
                "PYTHONPATH": str(BENCH),
                "PEERS_SYSTEM": system,
                "PEERS_REDIS_URL": self.rs.url,
                "PGDSN": self.pg.url,
                "PEERS_CONCURRENCY": str(self.args.concurrency),
            }
            | extra
        )

    def fresh(self, system: str) -> None:
        self.rs.flushall()
        self.pg.terminate_backends()
        self.pg.reset_all()
        self.pg.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    async def start_worker(self, system: str, directory: Path) -> asyncio.subprocess.Process:
        c = str(self.args.concurrency)
        bin_dir = Path(self.python).parent
        if system.startswith("ai_lease"):
            url = self.pg.url if system in POSTGRES else self.rs.url
            base_url = self.model_url
            config = settings_file(
                directory, url, argparse.Namespace(model="sse", http="auto"), base_url
            )
            argv = [*worker_command(), "--config", str(config), "worker", "--loop", self.args.loop]
            argv += ["--concurrency", c, "--worker-id", "w0"]
        elif system == "saq":
            argv = [str(bin_dir / "saq"), "_peers_app.saq_settings"]
        elif system == "arq":
            argv = [str(bin_dir / "arq"), "_peers_app.ArqSettings"]
        else:
            argv = [str(bin_dir / "pgq"), "run", "_peers_app:pgq_factory"]
            argv += ["--max-concurrent-tasks", c]
        with (directory / "worker.log").open("wb") as log:
            return await asyncio.create_subprocess_exec(
                *argv,
                cwd=directory,
                env=self.env(system),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    async def enqueue(self, system: str, store: Any, prefix: str, n: int) -> None:
        if system.startswith("ai_lease"):
            runner = Runner(store)
            for i in range(n):
                key = f"{prefix}-{i:05d}"
                await runner.submit(
                    Job(key, input=f"{key}. A sentence to keep.", prompt_text=PROMPT)
                )
            return
        proc = await asyncio.create_subprocess_exec(
            self.python,
            str(BENCH / "_peers_app.py"),
            "enqueue",
            system,
            prefix,
            str(n),
            env=self.env(system),
        )
        if await proc.wait() != 0:
            raise RuntimeError(f"{system}: enqueue failed")

    async def done(self, system: str) -> int:
        """How many jobs have finished (ai_lease), or are still to finish (peers: negative)."""
        self.polls += 1
        if system == "ai_lease_redis":
            return int(float(await self.admin.zscore(COUNTS_KEY, "DONE") or 0))
        if system == "saq":
            return -int(await self.admin.zcard("saq:default:incomplete"))
        if system == "arq":
            return -int(await self.admin.zcard("arq:queue"))
        table = (
            "ai_lease.ail_jobs WHERE status = 'DONE'"
            if system == "ai_lease_postgres"
            else "pgqueuer"
        )
        cursor = await self.poll_conn.execute(f"SELECT count(*) FROM {table}")
        row = await cursor.fetchone()
        return int(row[0]) if system == "ai_lease_postgres" else -int(row[0])

    async def wait(self, system: str, total: int, proc: asyncio.subprocess.Process) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        target = total if system.startswith("ai_lease") else 0
        while await self.done(system) < target:
            if proc.returncode is not None:
                raise RuntimeError(f"{system}: the worker exited ({proc.returncode})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system}: jobs not done after {TIMEOUT_S:g}s")
            await asyncio.sleep(POLL_S)

    async def ends(self, system: str, store: Any, prefix: str, n: int, since: float) -> float:
        if system.startswith("ai_lease"):
            records = [await store.get(f"{prefix}-{i:05d}") for i in range(n)]
            return max(r.updated_at for r in records if r is not None)
        proc = await asyncio.create_subprocess_exec(
            self.python,
            str(BENCH / "_peers_app.py"),
            "ends",
            system,
            prefix,
            str(n),
            env=self.env(system, PEERS_SINCE=f"{since - 1:.3f}"),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await proc.communicate()
        last, done = out.split()
        if int(done) < n:
            raise RuntimeError(f"{system}: {done} of {n} jobs recorded as finished")
        return float(last)

    # -- counting --------------------------------------------------------------------------------
    async def counts(self, system: str) -> Calls:
        if system in POSTGRES:
            return _pg_stats.snapshot(self.pg)
        return await snapshot(self.admin)

    def server_cpu(self, system: str) -> float:
        if system in POSTGRES:
            return pg_server_cpu_s(self.pg, self.poll_pid)
        return cpu_seconds([self.rs.pid])

    async def connect_pollers(self) -> None:
        import psycopg

        self.admin = client_for(self.rs.url)
        await self.admin.ping()
        self.poll_conn = await psycopg.AsyncConnection.connect(self.pg.url, autocommit=True)
        cursor = await self.poll_conn.execute("SELECT pg_backend_pid()")
        self.poll_pid = int((await cursor.fetchone())[0])

    async def close_pollers(self) -> None:
        if self.admin is not None:
            await self.admin.aclose()
        if self.poll_conn is not None:
            await self.poll_conn.close()
        self.admin = self.poll_conn = None

    # -- one measurement -------------------------------------------------------------------------
    async def measure(self, system: str, directory: Path) -> Sample:
        n, c = self.args.jobs, self.args.concurrency
        self.fresh(system)
        await self.connect_pollers()
        store = None
        if system.startswith("ai_lease"):
            store = open_store(self.pg.url if system in POSTGRES else self.rs.url, op_timeout=2.0)
        proc = await self.start_worker(system, directory)
        try:
            await self.enqueue(system, store, "warm", c)
            await self.wait(system, c, proc)
            pids = with_descendants([proc.pid])
            for pid in pids:
                signal_if_alive(pid, signal.SIGSTOP)
            s0, cpu_s0 = await self.counts(system), self.server_cpu(system)
            await self.enqueue(system, store, "bench", n)
            s1, cpu_s1 = await self.counts(system), self.server_cpu(system)
            self.polls = 0
            pids = with_descendants([proc.pid])
            w0 = cpu_seconds(pids)
            started = time.time()
            for pid in pids:
                signal_if_alive(pid, signal.SIGCONT)
            await self.wait(system, c + n, proc)
            w1 = cpu_seconds(with_descendants([proc.pid]))
            s2, cpu_s2 = await self.counts(system), self.server_cpu(system)
            polls = self.polls
            ended = await self.ends(system, store, "bench", n, started)
        finally:
            await self.stop(proc, directory, system)
            if store is not None:
                await store.aclose()
            await self.close_pollers()
        whole, run = Calls(), Calls()
        whole.add(s0, s2)
        run.add(s1, s2)
        sent, sent_run = self.less_polls(system, whole, polls), self.less_polls(system, run, polls)
        return Sample(
            jobs_per_s=n / (ended - started),
            worker_us=1e6 * (w1 - w0) / n,
            server_us=1e6 * (cpu_s2 - cpu_s0) / n,
            server_run_us=1e6 * (cpu_s2 - cpu_s1) / n,
            commands=sum(sent.values()) / n,
            commands_run=sum(sent_run.values()) / n,
            per_command={k: v / n for k, v in sent.items()},
            round_trips=sum(whole.sent().values()) / n if system == "ai_lease_redis" else 0.0,
        )

    @staticmethod
    def less_polls(system: str, calls: Calls, polls: int) -> dict[str, int]:
        """Every command the server ran (those inside scripts and MULTI blocks included: how
        ``INFO commandstats`` counts), less the bench's own polls."""
        ran = dict(calls.calls)
        poll = {"ai_lease_redis": "zscore", "saq": "zcard", "arq": "zcard"}.get(system, "select")
        ran[poll] = ran.get(poll, 0) - polls
        return {k: v for k, v in ran.items() if v}

    async def stop(self, proc: asyncio.subprocess.Process, directory: Path, system: str) -> None:
        if proc.returncode is None:
            for pid in with_descendants([proc.pid]):
                os.kill(pid, signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def run(self) -> dict[str, list[Sample] | str]:
        this = asyncio.current_task()
        assert this is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
        systems = self.args.systems.split(",")
        results: dict[str, list[Sample] | str] = {s: [] for s in systems}
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        model = ctx.Process(target=_serve_model, args=(theirs,), daemon=True)
        model.start()
        try:
            self.model_url = ours.recv()
            with tempfile.TemporaryDirectory(prefix="ai_lease-peers-") as tmp:
                await self.rounds(systems, results, Path(tmp))
        finally:
            ours.send("stop")
            model.join(10)
        return results

    async def rounds(
        self, systems: list[str], results: dict[str, list[Sample] | str], tmp: Path
    ) -> None:
        for r in range(self.args.rounds):
            for system in systems:
                samples = results[system]
                if isinstance(samples, str):
                    continue
                directory = tmp / f"{system}-{r}"
                directory.mkdir()
                try:
                    sample = await self.measure(system, directory)
                except RuntimeError as exc:
                    tail = (directory / "worker.log").read_text(errors="replace")[-400:]
                    results[system] = f"failed: {exc} | worker log: {tail!r}"
                    print(f"  round {r + 1}: {system}: {results[system]}", flush=True)
                    continue
                samples.append(sample)
                print(
                    f"  round {r + 1}: {system:<18} {sample.jobs_per_s:6.0f} jobs/s  worker "
                    f"{sample.worker_us:6.0f} us/job  server {sample.server_us:6.0f} us/job "
                    f"(run {sample.server_run_us:.0f})  commands/job {sample.commands:.2f} "
                    f"(run {sample.commands_run:.2f})",
                    flush=True,
                )


def setup(venv: Path) -> None:
    """Create the peers' venv and install them from the package index."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PEER_PACKAGES]
    subprocess.run(pip, check=True)


def versions(venv: Path) -> str:
    code = (
        "import importlib.metadata as m; print(' '.join(p + ' ' + m.version(p) for p in "
        f"{[p.split('<')[0] for p in PEER_PACKAGES]!r}))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--jobs", type=int, default=2000, help="jobs per measurement")
    p.add_argument("--concurrency", type=int, default=32, help="jobs at once in the worker")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="ai_lease's")
    p.add_argument("--pg-fsync", choices=["on", "off"], default="on", help="the cluster's fsync")
    p.add_argument("--peers-venv", default=str(BENCH / ".venv-peers"), help="the peers' venv")
    p.add_argument("--setup", action="store_true", help="create the peers' venv and exit")
    args = p.parse_args()
    venv = Path(args.peers_venv)
    if args.setup:
        setup(venv)
        print(versions(venv))
        return 0
    if not (venv / "bin" / "python").exists():
        print(f"no peers venv at {venv}: run `bench/peers.py --setup` first", file=sys.stderr)
        return 2
    print(
        f"peers: {args.jobs} no-op jobs, one worker process, concurrency {args.concurrency}, "
        f"{args.rounds} interleaved rounds; ai_lease `ai-lease worker -c {args.concurrency} "
        f"--loop {args.loop}` with openai-compatible on a loopback server answering at once "
        "(a child process); "
        f"{versions(venv)}; Python {sys.version.split()[0]}, redis-py {redis.__version__}; "
        f"PostgreSQL fsync {args.pg_fsync}"
    )
    pg = _pg_stats.cluster(fsync=args.pg_fsync == "on")
    try:
        pg_env = {**os.environ, "PGDSN": pg.url}
        bin_dir = venv / "bin"
        subprocess.run(
            [str(bin_dir / "pgq"), "install"], env=pg_env, check=True, capture_output=True
        )
        with RedisServer() as rs:
            try:
                results = asyncio.run(Peers(args, rs, pg).run())
            except (asyncio.CancelledError, KeyboardInterrupt):
                print("interrupted: workers and servers stopped", file=sys.stderr)
                return 1
    finally:
        pg.close()
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
