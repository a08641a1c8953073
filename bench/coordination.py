"""Coordination cost per job: whole single-flight jobs through the Runner against bare lock cycles.

    .venv/bin/python bench/coordination.py             # 3 s per variant, 8 concurrent, 3 rounds
    .venv/bin/python bench/coordination.py --profile   # also: where the pipeline's time goes
    .venv/bin/python bench/coordination.py --breakdown # also: per command, per job; CPU by area

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary and PostgreSQL's server binaries). It starts its own ``redis-server``
and its own PostgreSQL cluster (tests/harness; bench/_pg_stats.py), and SQLite files in a
temporary directory.

Variants, each looping over fresh keys with ``--concurrency`` tasks on one event loop:

* ``pipeline``  ``Runner.run(Job(...))``: preflight, acquire, the keeper beside the five default
  stages (load, build_prompt, call_ai streamed from an instant scripted provider, parse,
  persist = the fenced commit). The Runner's defaults (history, tracing), as the CLI and
  the worker run it. What a caller actually pays.
* ``store``     ``RedisStore`` acquire + commit alone (the lease part of ``pipeline``).
* ``pair``      what a careful user hand-rolls on redis-py + hiredis (bench/_pair.py): an acquire
  script (SET NX PX + INCR fencing token) and a compare-and-set commit script, 2 round trips
  per job, same server, same client settings (decoded replies, 2 s socket timeouts, redis-py
  retries off).
* ``pg-pipeline`` / ``pg-store``  the same two on ``PostgresStore`` (fsync on unless
  ``--pg-fsync off``); round trips are the top-level statements clients sent
  (``pg_stat_statements``), server µs their ``total_exec_time``.
* ``pg-pair``   what a careful user hand-rolls on psycopg 3 (bench/_pg_pair.py): a plpgsql
  acquire (insert or take over the key's row, fencing token + 1, expiry by the server's
  clock, a live lease refused) and a compare-and-set commit function in a schema of their
  own, one ``SELECT`` each in autocommit (2 round trips per job), same cluster, same
  durability (fsync per the cluster, the default ``synchronous_commit``), connections made
  as the store makes its own (a psycopg_pool pool of 2 to 20, the same startup options).
* ``sq-pipeline`` / ``sq-store``  the same two on ``SQLiteStore`` (embedded: no round trips).
* ``sq-pair``   the hand-written sqlite3 acquire + commit of bench/sqlite_pair.py
  (bench/_sqlite_pair.py): the store's durability and process style (WAL,
  ``synchronous=NORMAL``, one connection on a thread beside the loop, ``BEGIN IMMEDIATE`` per
  operation), in a file of its own.

Targets (issue 28, target 4): on every store, a whole job's throughput (``pipeline``, runner
defaults on) >= 0.5x its hand-rolled pair's in the same run. The server CPU per job against
the pair's (Redis: the ``usec`` of ``INFO commandstats``, every command; PostgreSQL: the
statements' ``total_exec_time``) is printed beside it, not judged. Round trips are the
commands clients sent (every command except the ones the Lua scripts run inside: among them
the job timeline's LINDEX / RPUSH / LTRIM, which every job script writes itself) or, on
PostgreSQL, the top-level statements.

``--scripts`` measures the scripts alone, warm: ``--script-jobs`` fresh jobs' ACQUIRE, then
their FINISH, each batch pipelined in one write (no client between two calls), against the
pair's acquire and commit, interleaved over 5 rounds, the lowest µs per call of each.

``--breakdown`` then runs ``--breakdown-jobs`` jobs of each variant one at a time and prints,
per command, its calls, µs per call and µs per job (the commands scripts run inside listed
apart: their time is part of their script's), and a cProfile of the pipeline's jobs summed
by area (ai_lease module, redis-py, asyncio, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import pstats
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

import _pair
import _pg_stats
from _pair import RESULT, Pair, client_for
from _pg_pair import PgPair
from _redis_stats import Calls, snapshot
from _sqlite_pair import SqlitePair

from ai_lease import Acquired, Job, LeaseStore, Pipeline, Runner
from ai_lease.stores.postgres.store import PostgresStore
from ai_lease.stores.redis import scripts as lua
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer

TARGET = 0.5  # issue 28, target 4: a whole job >= 0.5x the pair, on every store


@dataclass
class Stats:
    jobs: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    server: Calls = field(default_factory=Calls)
    lat: list[float] = field(default_factory=list)

    @property
    def commands(self) -> dict[str, int]:
        return self.server.sent()

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def round_trips(self) -> float:
        return sum(self.commands.values()) / self.jobs if self.jobs else float("nan")

    @property
    def server_us(self) -> float:
        return self.server.server_usec() / self.jobs if self.jobs else float("nan")

    def pct(self, q: float) -> float:
        xs = sorted(self.lat)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6 if xs else float("nan")


JobFn = Callable[[str, int], Awaitable[None]]


def pipeline_job(runner: Runner, named: bool) -> JobFn:
    """One job; its prompt is inline (``{{ input }}``) or the shipped ``summarize`` file."""

    async def job(key: str, w: int) -> None:
        spec = Job(key, input="x") if named else Job(key, input="x", prompt_text="{{ input }}")
        record = await runner.run(spec)
        if record.output != "ok":
            raise RuntimeError(f"bench: {key} ended with {record!r}")

    return job


def store_job(store: LeaseStore) -> JobFn:
    async def job(key: str, w: int) -> None:
        got = await store.acquire(key, f"node-{w}", ttl=30.0, max_no_progress=5.0)
        if not isinstance(got, Acquired):
            raise RuntimeError(f"bench: {key} was not acquired: {got!r}")
        await store.commit(got.fence, RESULT)

    return job


def pair_job(pair: Pair) -> JobFn:
    async def job(key: str, w: int) -> None:
        await pair.commit(key, await pair.acquire(key, f"node-{w}"))

    return job


def token_pair_job(pair: PgPair | SqlitePair) -> JobFn:
    """A job on a pair whose commit names the owner and its token (PostgreSQL, SQLite)."""

    async def job(key: str, w: int) -> None:
        owner = f"node-{w}"
        await pair.commit(key, owner, await pair.acquire(key, owner))

    return job


async def drive(job: JobFn, st: Stats, tag: str, seconds: float, workers: int) -> None:
    """Run ``job`` on fresh keys from ``workers`` concurrent tasks for ``seconds``."""
    end = time.perf_counter() + seconds
    counts = [0] * workers

    async def worker(w: int) -> None:
        while (t0 := time.perf_counter()) < end:
            await job(f"{tag}:{w}:{counts[w]}", w)
            st.lat.append(time.perf_counter() - t0)
            counts[w] += 1

    t0, c0 = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        for w in range(workers):
            tg.create_task(worker(w))
    st.seconds += time.perf_counter() - t0
    st.cpu += time.process_time() - c0
    st.jobs += sum(counts)


async def run(
    args: argparse.Namespace, url: str, pg: PostgresServer, tmp: Path
) -> dict[str, Stats]:
    run_id = uuid.uuid4().hex[:8]
    admin, pair_client = client_for(url), client_for(url)
    store = RedisStore.from_url(url, namespace=f"bench-{run_id}", op_timeout=2.0)
    pg_store = PostgresStore.from_url(pg.url, namespace=f"bench_{run_id}", op_timeout=2.0)
    sq_store = SQLiteStore(tmp / "bench.db", op_timeout=2.0)
    pg_pair = PgPair(pg.url, f"pair_{run_id}")
    sq_pair = SqlitePair(tmp / "pair.db")
    stores: dict[str, LeaseStore] = {"": store, "pg-": pg_store, "sq-": sq_store}
    pairs = {"": pair_job(Pair(pair_client)), "pg-": token_pair_job(pg_pair)}
    pairs["sq-"] = token_pair_job(sq_pair)
    variants: dict[str, JobFn] = {}
    for prefix, each in stores.items():
        runner = Runner(each, provider=ScriptedProvider(["ok"]), pipeline=Pipeline.default())
        variants[f"{prefix}pipeline"] = pipeline_job(runner, args.named_prompt)
        variants[f"{prefix}store"] = store_job(each)
        variants[f"{prefix}pair"] = pairs[prefix]
    results = {name: Stats() for name in variants}

    async def counts(name: str) -> Calls:
        if name.startswith("sq-"):
            return Calls()
        return _pg_stats.snapshot(pg) if name.startswith("pg-") else await snapshot(admin)

    try:
        await pg_pair.open()  # its schema, table and functions; then its pool
        for name, job in variants.items():  # warm up: connections, script cache, imports
            await drive(job, Stats(), f"warm:{run_id}:{name}", args.warmup, args.concurrency)
        for r in range(args.rounds):
            for name, job in variants.items():
                st, before = results[name], await counts(name)
                await drive(
                    job, st, f"{run_id}:{r}:{name}", args.seconds / args.rounds, args.concurrency
                )
                st.server.add(before, await counts(name))
        if args.profile:
            await profile(variants["pipeline"], run_id, args)
        if args.scripts:
            await script_costs(admin, run_id, args.script_jobs)
        if args.breakdown:
            on_redis = {k: variants[k] for k in ("pipeline", "store", "pair")}
            await breakdown(on_redis, admin, run_id, args.breakdown_jobs)
    finally:
        for each in stores.values():
            await each.aclose()
        await pg_pair.aclose()
        sq_pair.close()
        await pair_client.aclose()
        await admin.aclose()
    return results


async def profile(job: JobFn, run_id: str, args: argparse.Namespace) -> None:
    """cProfile the pipeline variant alone (slower under the profiler: read the shares)."""
    prof = cProfile.Profile()
    prof.enable()
    await drive(job, Stats(), f"prof:{run_id}", args.seconds / args.rounds, args.concurrency)
    prof.disable()
    print("\nprofile of the pipeline variant (cumulative, top 40):")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(40)


async def script_costs(admin: Any, run_id: str, n: int) -> None:
    """Server µs per call of each job script alone, warm (pipelined batches of ``n``)."""

    async def batch(script: str, calls: list[tuple[list[str], list[Any]]]) -> tuple[float, Any]:
        sha = await admin.script_load(script)
        pipe = admin.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(sha, len(keys), *keys, *args)
        before = await snapshot(admin)
        replies = await pipe.execute()
        spent = Calls()
        spent.add(before, await snapshot(admin))
        return spent.usec["evalsha"] / spent.calls["evalsha"], replies

    ns, best = f"scripts-{run_id}", {"ai_lease": [1e9, 1e9], "pair": [1e9, 1e9]}
    fp, owner = Job("k", input="x", prompt_text="{{ input }}").fingerprint(), "host:1234#1.abcd"
    for r in range(5):
        keys = [f"{ns}:{{{r}-{i}}}" for i in range(n)]
        job = [[f"{k}:job", f"{k}:events", f"{{{ns}:queue}}:leases"] for k in keys]
        argv = [owner, "30000000", "5000000", "expire", fp, "3", ""]
        acquire, got = await batch(lua.ACQUIRE, [(ks, argv) for ks in job])
        tokens = [dict(zip(g[3::2], g[4::2], strict=True))["token"] for g in got]
        finish = [[owner, t, "DONE", "result", '"ok"', "stop"] for t in tokens]
        commit, _ = await batch(lua.FINISH, list(zip(job, finish, strict=True)))
        best["ai_lease"] = [min(best["ai_lease"][0], acquire), min(best["ai_lease"][1], commit)]
        locks = [[f"p{k}:lock", f"p{k}:token"] for k in keys]
        acquire, got = await batch(_pair.ACQUIRE, [(ks, ["node-1", 30000]) for ks in locks])
        fences = [f"node-1:{token}" for token in got]
        done = [
            ([ks[0], f"{ks[0]}:result"], [f, RESULT]) for ks, f in zip(locks, fences, strict=True)
        ]
        commit, _ = await batch(_pair.COMMIT, done)
        best["pair"] = [min(best["pair"][0], acquire), min(best["pair"][1], commit)]
    print(f"\nscripts alone, warm ({n} per batch, best of 5), server µs per call:")
    pair = sum(best["pair"])
    for name, (acquire, commit) in best.items():
        print(
            f"  {name:<9} acquire {acquire:6.2f}  commit {commit:6.2f}  per job "
            f"{acquire + commit:6.2f}  ({(acquire + commit) / pair:.2f}x the pair)"
        )
    print(f"RESULT ratio_scripts_alone_vs_pair {(sum(best['ai_lease'])) / pair:.3f}")


async def breakdown(variants: dict[str, JobFn], admin: Any, run_id: str, n: int) -> None:
    """Each variant's jobs one at a time: the server's work per command, per job; then
    where the pipeline's client CPU goes, by area (cProfile: slower, read the shares)."""
    print(f"\nbreakdown: {n} jobs per variant, one at a time")
    for name, job in variants.items():
        calls, before = Calls(), await snapshot(admin)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            await job(f"seq:{run_id}:{name}:{i}", 0)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        calls.add(before, await snapshot(admin))
        print(
            f"\n  {name}: {n / wall:.0f} jobs/s one at a time, client CPU {cpu / n * 1e6:.0f} "
            f"µs/job, server {calls.server_usec() / n:.1f} µs/job in "
            f"{sum(calls.sent().values()) / n:.2f} round trips"
        )
        print("\n".join(calls.table(n)))
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        await variants["pipeline"](f"seqprof:{run_id}:{i}", 0)
    prof.disable()
    areas: collections.Counter[str] = collections.Counter()
    for fn, (_, _, own, _, _) in pstats.Stats(prof).stats.items():  # type: ignore[attr-defined]
        if "poll" not in fn[2]:  # the selector's wait for a reply is not CPU
            areas[_area(fn)] += own
    total = sum(areas.values())
    print(f"\n  pipeline client CPU by area (cProfile, {total / n * 1e6:.0f} µs/job profiled):")
    for area, own in areas.most_common(16):
        print(f"    {own / total * 100:5.1f} %  {own / n * 1e6:7.1f} µs/job  {area}")


def _area(fn: tuple[str, int, str]) -> str:
    """Where a profiled function lives: an ai_lease module, redis-py, asyncio, or a builtin."""
    path, _, name = fn
    if "/ai_lease/" in path:
        return "ai_lease/" + path.rsplit("/ai_lease/", 1)[1]
    if "/redis/" in path or "hiredis" in name:
        return "redis-py + hiredis"
    if "/asyncio/" in path or "select" in name or "_asyncio" in name:
        return "asyncio (loop, tasks, timers, selector)"
    if "socket" in name:
        return "socket send/recv"
    return "other (" + (path.rsplit("/", 1)[-1] if path != "~" else "builtins") + ")"


def report(res: dict[str, Stats]) -> None:
    heads = f"{'jobs/s':>7} {'CPU/job µs':>11} {'srv µs/job':>10} {'RT/job':>7} {'p50 µs':>8}"
    print(f"\n{'variant':<11} {heads} {'p99 µs':>8}")
    for name, st in res.items():
        print(
            f"{name:<11} {st.rate:7.0f} {st.cpu / st.jobs * 1e6:11.0f} {st.server_us:10.1f} "
            f"{st.round_trips:7.2f} {st.pct(0.5):8.0f} {st.pct(0.99):8.0f}   "
            f"{dict(sorted(st.commands.items()))}"
        )
    out: dict[str, float] = {}
    for prefix in ("", "pg-", "sq-"):
        tag = prefix.replace("-", "_")
        for part in ("pipeline", "store", "pair"):
            st = res[f"{prefix}{part}"]
            out[f"{tag}{part}_jobs_per_s"] = st.rate
            out[f"{tag}{part}_cpu_us_per_job"] = st.cpu / st.jobs * 1e6
        if prefix == "sq-":
            continue  # embedded: no server, no round trips
        for part in ("pipeline", "store", "pair"):
            out[f"{tag}{part}_server_us_per_job"] = res[f"{prefix}{part}"].server_us
        for part in ("pipeline", "store", "pair"):
            out[f"round_trips_{tag}{part}_per_job"] = res[f"{prefix}{part}"].round_trips
    verdicts = []
    for prefix in ("", "pg-", "sq-"):
        tag = prefix.replace("-", "_")
        pair = res[f"{prefix}pair"]
        for part in ("pipeline", "store"):
            out[f"ratio_{tag}{part}_vs_{tag}pair"] = res[f"{prefix}{part}"].rate / pair.rate
        if prefix != "sq-":
            for part in ("pipeline", "store"):
                server = res[f"{prefix}{part}"].server_us / pair.server_us
                out[f"ratio_server_cpu_{tag}{part}_vs_{tag}pair"] = server
        ratio = out[f"ratio_{tag}pipeline_vs_{tag}pair"]
        verdicts.append(
            (ratio >= TARGET, f"{tag}pipeline_job_vs_{tag}pair>={TARGET:g} ({ratio:.3f})")
        )
    print()
    for k, v in out.items():
        print(f"RESULT {k} {v:.3f}" if k.startswith(("ratio", "round")) else f"RESULT {k} {v:.0f}")
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per variant")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent jobs per variant")
    p.add_argument("--rounds", type=int, default=3, help="interleaved slices per variant")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per variant")
    p.add_argument("--profile", action="store_true", help="cProfile the pipeline afterwards")
    p.add_argument("--named-prompt", action="store_true", help="prompt file, not inline text")
    p.add_argument("--scripts", action="store_true", help="the job scripts alone, warm")
    p.add_argument("--script-jobs", type=int, default=3000, help="jobs per batch for it")
    p.add_argument("--breakdown", action="store_true", help="per command; client CPU by area")
    p.add_argument("--breakdown-jobs", type=int, default=2000, help="jobs per variant for it")
    p.add_argument("--pg-fsync", choices=["on", "off"], default="on", help="the cluster's fsync")
    args = p.parse_args()
    prompt = "named" if args.named_prompt else "inline"
    print(
        f"coordination: {args.seconds:g} s x {args.concurrency} concurrent per variant, "
        f"{args.rounds} rounds, {prompt} prompt; Python {sys.version.split()[0]}, "
        f"redis-py {redis.__version__}, psycopg {psycopg.__version__}, SQLite "
        f"{sqlite3.sqlite_version}; PostgreSQL fsync {args.pg_fsync}"
    )
    pg = _pg_stats.cluster(fsync=args.pg_fsync == "on")
    try:
        with RedisServer() as server, tempfile.TemporaryDirectory(prefix="ai_lease-") as tmp:
            report(asyncio.run(run(args, server.url, pg, Path(tmp))))
    finally:
        pg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
