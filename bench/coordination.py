"""Coordination cost per job: whole single-flight jobs through the Runner against bare lock cycles.

    .venv/bin/python bench/coordination.py             # 3 s per variant, 8 concurrent, 3 rounds
    .venv/bin/python bench/coordination.py --profile   # also: where the pipeline's time goes

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary). It starts its own ``redis-server`` (tests/harness).

Variants, each looping over fresh keys with ``--concurrency`` tasks on one event loop:

* ``pipeline``  ``Runner.run(Job(...))``: preflight, acquire, the keeper beside the five default
  stages (load, build_prompt, call_ai streamed from an instant scripted provider, parse,
  persist = the fenced commit). History and tracing off. What a caller actually pays.
* ``store``     ``RedisStore`` acquire + commit alone (the lease part of ``pipeline``).
* ``lock``      bare redis-py ``Lock``: acquire (SET NX PX) + extend + release, same server,
  same client settings (decoded replies, 2 s socket timeouts, redis-py retries off).

Target: a whole job costs no more than one bare lock cycle (pipeline / lock >= 1.0), in 2
round trips. Round trips are the commands clients sent, from ``INFO commandstats`` deltas
(every command except the ones ai_lease's and the lock's Lua scripts run inside).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.lock import Lock
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from ai_lease import Acquired, Job, Pipeline, Runner
from ai_lease.lease.redis import RedisStore
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.redis_server import RedisServer

TARGET, RT_TARGET = 1.0, 2.0
# Commands the Lua scripts run inside (ai_lease's, and the lock's extend/release): not sent
# by a client, so not round trips. INFO is this bench's own counter.
INNER = {"exists", "hget", "hgetall", "hincrby", "hmget", "hset", "publish", "time"}
INNER |= {"get", "pttl", "pexpire", "del", "info"}
RESULT = '{"answer": 42}'


@dataclass
class Stats:
    jobs: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    commands: dict[str, int] = field(default_factory=dict)
    lat: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def round_trips(self) -> float:
        return sum(self.commands.values()) / self.jobs if self.jobs else float("nan")

    def pct(self, q: float) -> float:
        xs = sorted(self.lat)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6 if xs else float("nan")


JobFn = Callable[[str, int], Awaitable[None]]


def client_for(url: str) -> Any:
    """The client RedisStore.from_url builds: decoded replies, no retries, 2 s timeouts."""
    return aioredis.from_url(
        url,
        decode_responses=True,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
    )


def pipeline_job(runner: Runner, named: bool) -> JobFn:
    """One job; its prompt is inline (``{{ input }}``) or the shipped ``summarize`` file."""

    async def job(key: str, w: int) -> None:
        spec = Job(key, input="x") if named else Job(key, input="x", prompt_text="{{ input }}")
        record = await runner.run(spec)
        if record.output != "ok":
            raise RuntimeError(f"bench: {key} ended with {record!r}")

    return job


def store_job(store: RedisStore) -> JobFn:
    async def job(key: str, w: int) -> None:
        got = await store.acquire(key, f"node-{w}", ttl=30.0, max_no_progress=5.0)
        if not isinstance(got, Acquired):
            raise RuntimeError(f"bench: {key} was not acquired: {got!r}")
        await store.commit(got.fence, RESULT)

    return job


def lock_job(client: Any) -> JobFn:
    async def job(key: str, w: int) -> None:
        lock = Lock(client, f"bench-lock:{{{key}}}", timeout=30.0, blocking=False)
        if not await lock.acquire():
            raise RuntimeError(f"bench: lock {key} was not acquired")
        await lock.extend(30.0, replace_ttl=True)
        await lock.release()

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


async def command_counts(admin: Any) -> dict[str, int]:
    info = await admin.info("commandstats")
    return {k[8:]: int(v["calls"]) for k, v in info.items() if k[8:] not in INNER}


async def run(args: argparse.Namespace, url: str) -> dict[str, Stats]:
    run_id = uuid.uuid4().hex[:8]
    admin, lock_client = client_for(url), client_for(url)
    store = RedisStore.from_url(url, namespace=f"bench-{run_id}", op_timeout=2.0)
    runner = Runner(
        store,
        provider=ScriptedProvider(["ok"]),
        pipeline=Pipeline.default(),
        record_history=False,
        trace=False,
    )
    variants = {
        "pipeline": pipeline_job(runner, args.named_prompt),
        "store": store_job(store),
        "lock": lock_job(lock_client),
    }
    results = {name: Stats() for name in variants}
    try:
        for name, job in variants.items():  # warm up: connections, script cache, imports
            await drive(job, Stats(), f"warm:{run_id}:{name}", args.warmup, args.concurrency)
        for r in range(args.rounds):
            for name, job in variants.items():
                st, before = results[name], await command_counts(admin)
                await drive(
                    job, st, f"{run_id}:{r}:{name}", args.seconds / args.rounds, args.concurrency
                )
                for cmd, n in (await command_counts(admin)).items():
                    if n - before.get(cmd, 0):
                        st.commands[cmd] = st.commands.get(cmd, 0) + n - before.get(cmd, 0)
        if args.profile:
            await profile(variants["pipeline"], run_id, args)
    finally:
        await store.aclose()
        await lock_client.aclose()
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


def report(res: dict[str, Stats]) -> None:
    heads = f"{'jobs/s':>7} {'CPU/job µs':>11} {'RT/job':>7} {'p50 µs':>8} {'p99 µs':>8}"
    print(f"\n{'variant':<9} {heads}")
    for name, st in res.items():
        print(
            f"{name:<9} {st.rate:7.0f} {st.cpu / st.jobs * 1e6:11.0f} {st.round_trips:7.2f} "
            f"{st.pct(0.5):8.0f} {st.pct(0.99):8.0f}   {dict(sorted(st.commands.items()))}"
        )
    pipe, store, lock = res["pipeline"], res["store"], res["lock"]
    out = {
        "pipeline_jobs_per_s": pipe.rate,
        "store_jobs_per_s": store.rate,
        "lock_cycles_per_s": lock.rate,
        "pipeline_cpu_us_per_job": pipe.cpu / pipe.jobs * 1e6,
        "store_cpu_us_per_job": store.cpu / store.jobs * 1e6,
        "lock_cpu_us_per_cycle": lock.cpu / lock.jobs * 1e6,
        "ratio_pipeline_vs_lock": pipe.rate / lock.rate,
        "ratio_store_vs_lock": store.rate / lock.rate,
        "round_trips_pipeline_per_job": pipe.round_trips,
        "round_trips_lock_per_cycle": lock.round_trips,
    }
    print()
    for k, v in out.items():
        print(f"RESULT {k} {v:.3f}" if k.startswith(("ratio", "round")) else f"RESULT {k} {v:.0f}")
    ratio, rt = out["ratio_pipeline_vs_lock"], out["round_trips_pipeline_per_job"]
    verdicts = [
        (ratio >= TARGET, f"pipeline_job_vs_bare_lock_cycle>={TARGET:g} ({ratio:.3f})"),
        (abs(rt - RT_TARGET) < 0.01, f"pipeline_round_trips_per_job=={RT_TARGET:g} ({rt:.2f})"),
    ]
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
    args = p.parse_args()
    prompt = "named" if args.named_prompt else "inline"
    print(
        f"coordination: {args.seconds:g} s x {args.concurrency} concurrent per variant, "
        f"{args.rounds} rounds, {prompt} prompt; Python {sys.version.split()[0]}, "
        f"redis-py {redis.__version__}"
    )
    with RedisServer() as server:
        report(asyncio.run(run(args, server.url)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
