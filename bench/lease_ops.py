"""The hot lease operations, side by side in one run, with ratios and a verdict per target.

    .venv/bin/python bench/lease_ops.py              # 3 s per variant, 8 workers, 3 rounds
    .venv/bin/python bench/lease_ops.py --seconds 6 --concurrency 1

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary). It starts its own ``redis-server`` (tests/harness) and writes its
SQLite file to a temporary directory, so nothing already running is touched.

Variants, each looping over fresh keys with ``--concurrency`` workers on one event loop:

* ``redis full``   ai_lease ``RedisStore``: acquire + renew + commit (a job longer than one renew
  interval; 3 round trips).
* ``redis short``  ai_lease ``RedisStore``: acquire + commit (a job shorter than one renew
  interval; 2 round trips). Target: at least as many jobs/s as bare lock cycles.
* ``redis lock``   bare redis-py ``redis.asyncio.lock.Lock``: acquire (SET NX PX) + extend
  (EVALSHA) + release (EVALSHA) on the same server, same client settings.
* ``sqlite full``  ai_lease ``SQLiteStore`` (WAL file): acquire + renew + commit.

``--seconds`` of measuring per variant is split into ``--rounds`` interleaved slices, so a
slow patch of the machine hits every variant alike. Round trips are counted server-side from
``INFO commandstats``: evalsha/eval for ai_lease; set + evalsha/eval for the lock (the commands
the scripts run inside are counted too, but neither side's scripts call SET).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
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
from redis.utils import HIREDIS_AVAILABLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from ai_lease.lease.base import Acquired
from ai_lease.lease.redis import RedisStore
from ai_lease.lease.sqlite import SQLiteStore
from tests.harness.redis_server import RedisServer

TTL_S = 30.0
RESULT = '{"answer": 42, "model": "bench"}'
RENEW_ARGS: dict[str, Any] = {
    "ttl": TTL_S,
    "stage": "call_ai",
    "progress_version": 1,
    "max_no_progress": 90.0,
    "grace": 5.0,
}
SHORT_TARGET = 1.0  # a whole short job costs no more than one bare lock cycle


@dataclass
class Stats:
    """What one variant measured: jobs done, seconds spent, per-op latencies, round trips."""

    jobs: int = 0
    seconds: float = 0.0
    round_trips: int = 0
    lat: dict[str, list[float]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    def pct(self, op: str, q: float) -> float:
        xs = sorted(self.lat.get(op, ()))
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6 if xs else float("nan")


Job = Callable[[str, str, Stats], Awaitable[None]]


async def timed(stats: Stats, op: str, aw: Awaitable[Any]) -> Any:
    t0 = time.perf_counter()
    out = await aw
    stats.lat.setdefault(op, []).append(time.perf_counter() - t0)
    return out


def lease_job(store: Any, renew: bool) -> Job:
    """One job through an ai_lease store: acquire, (renew,) commit."""

    async def job(key: str, owner: str, st: Stats) -> None:
        got = await timed(st, "acquire", store.acquire(key, owner, ttl=TTL_S, max_no_progress=5))
        if not isinstance(got, Acquired):
            raise RuntimeError(f"bench: {key} was not acquired: {got!r}")
        if renew:
            ok = await timed(st, "renew", store.renew(got.fence, **RENEW_ARGS))
            if not ok.ok:
                raise RuntimeError(f"bench: renew of {key} refused: {ok!r}")
        await timed(st, "commit", store.commit(got.fence, RESULT))

    return job


def lock_job(client: Any) -> Job:
    """One bare redis-py lock cycle: acquire (SET NX PX), extend, release."""

    async def job(key: str, owner: str, st: Stats) -> None:
        lock = Lock(client, f"bench-lock:{{{key}}}", timeout=TTL_S, blocking=False)
        if not await timed(st, "acquire", lock.acquire()):
            raise RuntimeError(f"bench: lock {key} was not acquired")
        await timed(st, "renew", lock.extend(TTL_S, replace_ttl=True))
        await timed(st, "commit", lock.release())

    return job


async def drive(job: Job, stats: Stats, tag: str, seconds: float, workers: int) -> None:
    """Run ``job`` on fresh keys from ``workers`` concurrent tasks for ``seconds``."""
    end = time.perf_counter() + seconds
    counts = [0] * workers

    async def worker(w: int) -> None:
        while time.perf_counter() < end:
            await job(f"{tag}:{w}:{counts[w]}", f"node-{w}", stats)
            counts[w] += 1

    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for w in range(workers):
            tg.create_task(worker(w))
    stats.seconds += time.perf_counter() - t0
    stats.jobs += sum(counts)


async def script_calls(admin: Any, commands: tuple[str, ...]) -> int:
    info = await admin.info("commandstats")
    return sum(int(info.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)


def client_for(url: str) -> Any:
    """The client RedisStore.from_url builds, for the bare lock: decoded replies, no retries."""
    return aioredis.from_url(
        url,
        decode_responses=True,
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
    )


async def run(args: argparse.Namespace, url: str, tmp: str) -> dict[str, Stats]:
    run_id = uuid.uuid4().hex[:8]
    admin, lock_client = client_for(url), client_for(url)
    redis_store = RedisStore.from_url(url, namespace=f"bench-{run_id}", op_timeout=2.0)
    sqlite_store = SQLiteStore(Path(tmp) / "bench.db")
    scripts, lock_cmds = ("evalsha", "eval"), ("set", "evalsha", "eval")
    variants: dict[str, tuple[Job, tuple[str, ...] | None]] = {
        "redis full": (lease_job(redis_store, renew=True), scripts),
        "redis short": (lease_job(redis_store, renew=False), scripts),
        "redis lock": (lock_job(lock_client), lock_cmds),
        "sqlite full": (lease_job(sqlite_store, renew=True), None),
    }
    results = {name: Stats() for name in variants}
    try:
        for name, (job, _) in variants.items():  # warm up: connections, script cache
            await drive(job, Stats(), f"warm:{run_id}:{name}", args.warmup, args.concurrency)
        for r in range(args.rounds):
            for name, (job, cmds) in variants.items():
                before = await script_calls(admin, cmds) if cmds else 0
                tag = f"{run_id}:{r}:{name}"
                await drive(job, results[name], tag, args.seconds / args.rounds, args.concurrency)
                if cmds:
                    results[name].round_trips += await script_calls(admin, cmds) - before
    finally:
        await redis_store.aclose()
        await sqlite_store.aclose()
        await lock_client.aclose()
        await admin.aclose()
    return results


def report(res: dict[str, Stats]) -> None:
    ops = ("acquire", "renew", "commit")
    heads = " ".join(f"{op + ' p50/p99':>16}" for op in ops)
    print(f"\n{'variant':<12} {'jobs/s':>8} {'RT/job':>7}   {heads}  (µs)")
    for name, st in res.items():
        rt = f"{st.round_trips / st.jobs:.2f}" if st.round_trips else "-"
        cells = [
            f"{st.pct(op, 0.5):7.0f}/{st.pct(op, 0.99):<8.0f}" if op in st.lat else f"{'-':>16}"
            for op in ops
        ]
        print(f"{name:<12} {st.rate:8.0f} {rt:>7}   " + " ".join(cells))
    print("(redis lock: renew = extend, commit = release)\n")

    names = ("redis full", "redis short", "redis lock", "sqlite full")
    full, short, lock, lite = (res[n] for n in names)
    out: dict[str, float] = {
        "redis_full_jobs_per_s": full.rate,
        "redis_short_jobs_per_s": short.rate,
        "redis_lock_cycles_per_s": lock.rate,
        "sqlite_full_jobs_per_s": lite.rate,
        "ratio_redis_full_vs_lock": full.rate / lock.rate,
        "ratio_redis_short_vs_lock": short.rate / lock.rate,
        "round_trips_redis_full_per_job": full.round_trips / full.jobs,
        "round_trips_redis_short_per_job": short.round_trips / short.jobs,
        "round_trips_redis_lock_per_cycle": lock.round_trips / lock.jobs,
    }
    for vname, st in res.items():
        for op in st.lat:
            for q in (0.5, 0.99):
                out[f"{vname.replace(' ', '_')}_{op}_p{round(q * 100)}_us"] = st.pct(op, q)
    for k, v in out.items():
        print(f"RESULT {k} {v:.3f}" if k.startswith(("ratio", "round")) else f"RESULT {k} {v:.0f}")

    verdicts = [
        (
            out["ratio_redis_short_vs_lock"] >= SHORT_TARGET,
            f"redis_short_job_vs_bare_lock_cycle>={SHORT_TARGET:.1f} "
            f"(ratio {out['ratio_redis_short_vs_lock']:.2f})",
        ),
        (
            abs(out["round_trips_redis_full_per_job"] - 3) < 0.01
            and abs(out["round_trips_redis_short_per_job"] - 2) < 0.01,
            "redis_one_round_trip_per_lease_op "
            f"(full {out['round_trips_redis_full_per_job']:.2f}/3, "
            f"short {out['round_trips_redis_short_per_job']:.2f}/2)",
        ),
    ]
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per variant")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent workers per variant")
    p.add_argument("--rounds", type=int, default=3, help="interleaved slices per variant")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per variant")
    args = p.parse_args()
    print(
        f"lease_ops: {args.seconds:g} s x {args.concurrency} workers per variant, "
        f"{args.rounds} rounds; Python {sys.version.split()[0]}, redis-py {redis.__version__}, "
        f"hiredis {'on' if HIREDIS_AVAILABLE else 'off'}"
    )
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="ai_lease-bench-") as tmp:
        report(asyncio.run(run(args, server.url, tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
