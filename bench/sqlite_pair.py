"""SQLite: ai_lease's store and a whole job against a hand-written sqlite3 acquire + commit.

    .venv/bin/python bench/sqlite_pair.py                          # this checkout alone
    .venv/bin/python bench/sqlite_pair.py --baseline /work/main    # and an older checkout beside it

Run from the repository root in the dev environment (``pip install -e '.[dev]'``); needs
nothing else (SQLite files in a temporary directory). ``--baseline DIR`` runs the same
variants with ``DIR/.venv/bin/python``, whose ``ai_lease`` is that checkout's (an editable
install), interleaved with this checkout's, round by round.

Variants, each in a fresh child process (``--concurrency`` tasks on one event loop, fresh keys,
one new SQLite file per child, a warm-up first):

* ``pair``      what a careful user writes on the standard library's sqlite3, in the store's
  process style and with its durability: one connection on one thread beside the event loop
  (``run_in_executor``), WAL, ``synchronous=NORMAL``, autocommit off (``isolation_level=None``
  and an explicit ``BEGIN IMMEDIATE`` per operation). ``acquire``: read the lock row, refuse
  a live lease or a stored result, else write owner + next fencing token + expiry. ``commit``:
  read the row, refuse a fence that is not ours or a result already stored, else store the
  result and clear the lease. Two write transactions per job, as the store's
  (bench/_sqlite_pair.py, shared with bench/coordination.py).
* ``store``     ``SQLiteStore`` acquire + commit (the lease part of a job: the record, the
  listing's indexes and the timeline written in the same two transactions).
* ``pipeline``  ``Runner.run(Job(key, input="x", prompt_text="{{ input }}"))`` on the store:
  the default pipeline and the Runner's defaults, an instant scripted model.

Targets (issue 28, target 3): ``store`` >= 0.5x ``pair`` in the same run; with ``--baseline``,
this checkout's ``store`` and ``pipeline`` jobs/s >= 2x the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _sqlite_pair import RESULT, SqlitePair

VARIANTS = ("pair", "store", "pipeline")
PAIR_TARGET, SPEEDUP_TARGET = 0.5, 2.0

JobFn = Callable[[str, int], Awaitable[None]]


def _job(variant: str, path: Path) -> tuple[JobFn, Callable[[], Awaitable[None]]]:
    """The job of one variant and how to close what it opened."""
    if variant == "pair":
        pair = SqlitePair(path)

        async def pair_job(key: str, w: int) -> None:
            await pair.commit(key, f"node-{w}", await pair.acquire(key, f"node-{w}"))

        async def close_pair() -> None:
            pair.close()

        return pair_job, close_pair
    from ai_lease import Acquired, Job, Pipeline, Runner
    from ai_lease.stores.sqlite.store import SQLiteStore
    from ai_lease.testing.scripted import ScriptedProvider

    store = SQLiteStore(path, op_timeout=2.0)
    if variant == "store":

        async def store_job(key: str, w: int) -> None:
            got = await store.acquire(key, f"node-{w}", ttl=30.0, max_no_progress=5.0)
            if not isinstance(got, Acquired):
                raise RuntimeError(f"bench: {key} was not acquired: {got!r}")
            await store.commit(got.fence, RESULT)

        return store_job, store.aclose
    runner = Runner(store, provider=ScriptedProvider(["ok"]), pipeline=Pipeline.default())

    async def pipeline_job(key: str, w: int) -> None:
        record = await runner.run(Job(key, input="x", prompt_text="{{ input }}"))
        if record.output != "ok":
            raise RuntimeError(f"bench: {key} ended with {record!r}")

    return pipeline_job, store.aclose


async def _drive(job: JobFn, tag: str, seconds: float, workers: int) -> tuple[int, float, float]:
    end = time.perf_counter() + seconds
    counts = [0] * workers

    async def worker(w: int) -> None:
        while time.perf_counter() < end:
            await job(f"{tag}:{w}:{counts[w]}", w)
            counts[w] += 1

    t0, c0 = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        for w in range(workers):
            tg.create_task(worker(w))
    return sum(counts), time.perf_counter() - t0, time.process_time() - c0


async def _child(args: argparse.Namespace) -> dict[str, float]:
    job, close = _job(args.child, Path(args.db))
    try:
        await _drive(job, "warm", args.warmup, args.concurrency)
        jobs, wall, cpu = await _drive(job, "run", args.seconds, args.concurrency)
    finally:
        await close()
    return {"jobs": jobs, "seconds": wall, "cpu": cpu}


def _spawn(python: str, variant: str, args: argparse.Namespace, tmp: str) -> dict[str, float]:
    db = tempfile.mkdtemp(dir=tmp)
    cmd = [python, str(Path(__file__).resolve()), "--child", variant]
    cmd += ["--db", os.path.join(db, "bench.db"), "--seconds", str(args.seconds)]
    cmd += ["--concurrency", str(args.concurrency), "--warmup", str(args.warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _report(runs: dict[tuple[str, str], list[dict[str, float]]], trees: list[str]) -> None:
    rate = {k: [r["jobs"] / r["seconds"] for r in v] for k, v in runs.items()}
    print(f"\n{'tree':<9} {'variant':<9} {'jobs/s (median; every round)':<40} {'CPU µs/job':>10}")
    for (tree, variant), rs in runs.items():
        cpu = sum(r["cpu"] for r in rs) / sum(r["jobs"] for r in rs) * 1e6
        each = " / ".join(f"{x:.0f}" for x in rate[tree, variant])
        print(
            f"{tree:<9} {variant:<9} {statistics.median(rate[tree, variant]):7.0f} ({each})"
            f"{'':<4} {cpu:10.0f}"
        )
    print()
    med = {k: statistics.median(v) for k, v in rate.items()}
    shown = [v for v in ("store", "pipeline") if ("this", v) in rate]
    for tree in trees:
        for variant in shown:
            per_round = [
                s / p for s, p in zip(rate[tree, variant], rate["this", "pair"], strict=True)
            ]
            each = " / ".join(f"{x:.3f}" for x in per_round)
            print(f"RESULT {tree}_{variant}_vs_pair {statistics.median(per_round):.3f} ({each})")
        for variant in shown:
            print(f"RESULT {tree}_{variant}_jobs_per_s {med[tree, variant]:.0f}")
    this = trees[0]
    if "store" not in shown:
        return
    ratio = statistics.median(
        [s / p for s, p in zip(rate[this, "store"], rate[this, "pair"], strict=True)]
    )
    verdicts = [(ratio >= PAIR_TARGET, f"sqlite_store_vs_pair>={PAIR_TARGET:g} ({ratio:.3f})")]
    if len(trees) > 1:
        for variant in shown:
            up = [
                a / b for a, b in zip(rate[this, variant], rate["baseline", variant], strict=True)
            ]
            print(
                f"RESULT {variant}_vs_baseline {statistics.median(up):.3f} "
                f"({' / '.join(f'{x:.2f}' for x in up)})"
            )
            verdicts.append(
                (
                    statistics.median(up) >= SPEEDUP_TARGET,
                    f"sqlite_{variant}_vs_baseline>={SPEEDUP_TARGET:g} "
                    f"({statistics.median(up):.3f})",
                )
            )
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per child")
    p.add_argument("--concurrency", type=int, default=8, help="concurrent jobs per child")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per child")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument("--baseline", help="an older checkout with its own .venv, run beside")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args))))
        return 0
    variants = [v for v in args.variants.split(",") if v]
    if "pair" not in variants:
        variants.insert(0, "pair")
    trees = {"this": sys.executable}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline) / ".venv" / "bin" / "python")
    print(
        f"sqlite_pair: {args.seconds:g} s x {args.concurrency} concurrent per child, "
        f"{args.rounds} rounds, Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}"
        f"{', baseline ' + args.baseline if args.baseline else ''}"
    )
    runs: dict[tuple[str, str], list[dict[str, float]]] = {
        (t, v): [] for t in trees for v in variants
    }
    with tempfile.TemporaryDirectory(prefix="ai_lease-sq-") as tmp:
        for _ in range(args.rounds):
            for tree, python in trees.items():
                for variant in variants:
                    if variant == "pair" and tree != "this":
                        continue  # the pair is the same code whichever checkout runs it
                    runs[tree, variant].append(_spawn(python, variant, args, tmp))
    runs = {k: v for k, v in runs.items() if v}
    _report(runs, list(trees))
    return 0


if __name__ == "__main__":
    sys.exit(main())
