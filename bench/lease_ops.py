"""The hot lease operations against the hand-rolled pair, side by side in one run, with verdicts.

    .venv/bin/python bench/lease_ops.py              # 3 s per variant, 8 workers, 3 rounds
    .venv/bin/python bench/lease_ops.py --seconds 6 --concurrency 1

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary). It starts its own ``redis-server`` (tests/harness) and writes its
SQLite file to a temporary directory, so nothing already running is touched.

Variants, each looping over fresh keys with ``--concurrency`` workers on one event loop:

* ``redis full``   ai_lease ``RedisStore``: acquire + renew + commit (a job longer than one renew
  interval; 3 round trips).
* ``pair full``    the hand-rolled pair on redis-py + hiredis (bench/_pair.py, the anchor of
  bench/coordination.py too): acquire (INCR token + SET NX PX) + extend (fenced PEXPIRE) +
  fenced commit, 3 round trips, same server, same client settings.
* ``redis short``  ai_lease ``RedisStore``: acquire + commit (a job shorter than one renew
  interval; 2 round trips).
* ``pair short``   the pair's acquire + commit (2 round trips).
* ``sqlite full``  ai_lease ``SQLiteStore`` (WAL file): acquire + renew + commit.

Targets, ai_lease against the pair with as many round trips: jobs/s >= 0.9x (full and short),
Redis server CPU per job (``INFO commandstats`` usec of the commands clients sent) <= 1.3x,
and one round trip per lease operation.

``--seconds`` of measuring per variant is split into ``--rounds`` interleaved slices, so a
slow patch of the machine hits every variant alike. Round trips are the commands clients sent
(bench/_redis_stats.py: every command but the ones the scripts run inside).
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
from redis.utils import HIREDIS_AVAILABLE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from _pair import Pair, client_for
from _redis_stats import Calls, snapshot

from ai_lease.lease.base import Acquired
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
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
TARGET, CPU_TARGET = 0.9, 1.3  # against the pair, as many round trips


@dataclass
class Stats:
    """What one variant measured: jobs done, seconds spent, per-op latencies, round trips."""

    jobs: int = 0
    seconds: float = 0.0
    server: Calls = field(default_factory=Calls)
    lat: dict[str, list[float]] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def round_trips(self) -> float:
        return sum(self.server.sent().values()) / self.jobs if self.jobs else float("nan")

    @property
    def server_us(self) -> float:
        return self.server.server_usec() / self.jobs if self.jobs else float("nan")

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


def pair_job(pair: Pair, renew: bool) -> Job:
    """One job through the hand-rolled pair: acquire, (extend,) commit."""

    async def job(key: str, owner: str, st: Stats) -> None:
        fence = await timed(st, "acquire", pair.acquire(key, owner))
        if renew:
            await timed(st, "renew", pair.extend(key, fence))
        await timed(st, "commit", pair.commit(key, fence, RESULT))

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


async def run(args: argparse.Namespace, url: str, tmp: str) -> dict[str, Stats]:
    run_id = uuid.uuid4().hex[:8]
    admin, pair = client_for(url), Pair(client_for(url), ttl_ms=round(TTL_S * 1000))
    redis_store = RedisStore.from_url(url, namespace=f"bench-{run_id}", op_timeout=2.0)
    sqlite_store = SQLiteStore(Path(tmp) / "bench.db")
    variants: dict[str, tuple[Job, bool]] = {  # name: (job, counted on the Redis server)
        "redis full": (lease_job(redis_store, renew=True), True),
        "pair full": (pair_job(pair, renew=True), True),
        "redis short": (lease_job(redis_store, renew=False), True),
        "pair short": (pair_job(pair, renew=False), True),
        "sqlite full": (lease_job(sqlite_store, renew=True), False),
    }
    results = {name: Stats() for name in variants}
    try:
        for name, (job, _) in variants.items():  # warm up: connections, script cache
            await drive(job, Stats(), f"warm:{run_id}:{name}", args.warmup, args.concurrency)
        for r in range(args.rounds):
            for name, (job, on_redis) in variants.items():
                before = await snapshot(admin) if on_redis else None
                tag = f"{run_id}:{r}:{name}"
                await drive(job, results[name], tag, args.seconds / args.rounds, args.concurrency)
                if before is not None:
                    results[name].server.add(before, await snapshot(admin))
    finally:
        await redis_store.aclose()
        await sqlite_store.aclose()
        await admin.aclose()
    return results


def report(res: dict[str, Stats]) -> None:
    ops = ("acquire", "renew", "commit")
    heads = " ".join(f"{op + ' p50/p99':>16}" for op in ops)
    print(f"\n{'variant':<12} {'jobs/s':>8} {'RT/job':>7} {'srv µs/job':>10}   {heads}  (µs)")
    for name, st in res.items():
        redis_side = st.server.calls != {}
        rt = f"{st.round_trips:.2f}" if redis_side else "-"
        srv = f"{st.server_us:.1f}" if redis_side else "-"
        cells = [
            f"{st.pct(op, 0.5):7.0f}/{st.pct(op, 0.99):<8.0f}" if op in st.lat else f"{'-':>16}"
            for op in ops
        ]
        print(f"{name:<12} {st.rate:8.0f} {rt:>7} {srv:>10}   " + " ".join(cells))
    print("(pair: renew = extend)\n")

    out: dict[str, float] = {f"{n.replace(' ', '_')}_jobs_per_s": st.rate for n, st in res.items()}
    for kind in ("full", "short"):
        ours, pair = res[f"redis {kind}"], res[f"pair {kind}"]
        out[f"ratio_redis_{kind}_vs_pair"] = ours.rate / pair.rate
        out[f"ratio_server_cpu_redis_{kind}_vs_pair"] = ours.server_us / pair.server_us
        out[f"round_trips_redis_{kind}_per_job"] = ours.round_trips
        out[f"round_trips_pair_{kind}_per_job"] = pair.round_trips
        out[f"server_us_redis_{kind}_per_job"] = ours.server_us
        out[f"server_us_pair_{kind}_per_job"] = pair.server_us
    for vname, st in res.items():
        for op in st.lat:
            for q in (0.5, 0.99):
                out[f"{vname.replace(' ', '_')}_{op}_p{round(q * 100)}_us"] = st.pct(op, q)
    for k, v in out.items():
        print(f"RESULT {k} {v:.3f}" if k.startswith(("ratio", "round")) else f"RESULT {k} {v:.0f}")

    full, short = out["round_trips_redis_full_per_job"], out["round_trips_redis_short_per_job"]
    verdicts = [
        (
            abs(full - 3) < 0.01 and abs(short - 2) < 0.01,
            f"redis_one_round_trip_per_lease_op (full {full:.2f}/3, short {short:.2f}/2)",
        ),
    ]
    for kind in ("full", "short"):
        ratio, cpu = (
            out[f"ratio_redis_{kind}_vs_pair"],
            out[f"ratio_server_cpu_redis_{kind}_vs_pair"],
        )
        verdicts.append((ratio >= TARGET, f"redis_{kind}_vs_pair>={TARGET:g} ({ratio:.3f})"))
        verdicts.append(
            (cpu <= CPU_TARGET, f"server_cpu_redis_{kind}_vs_pair<={CPU_TARGET:g} ({cpu:.3f})")
        )
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
