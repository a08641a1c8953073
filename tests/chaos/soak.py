"""Soak: worker processes run a stream of jobs while random faults hit them, then check.

    python -m tests.chaos.soak --minutes 10 --workers 4 [--fault-every 10] [--seed 1]

Starts its own ``redis-server`` and a fault proxy, and ``--workers`` worker processes
(``tests/harness/worker_proc.py``: a real ``ai_lease.run.worker.Worker`` with signal handlers,
fast lease timings: TTL 2 s, renewal 0.5 s, sweep 0.2 s); every other worker reaches Redis
through the proxy. Jobs (1 s of streaming each) are submitted at ``--rate`` per second.
About every ``--fault-every`` seconds one random fault strikes:

* ``kill``: SIGKILL a worker (a fresh one replaces it);
* ``pause``: SIGSTOP a worker for 3 s, then SIGCONT;
* ``term``: SIGTERM a worker (it drains and exits; a fresh one replaces it);
* ``redis_pause``: SIGSTOP the Redis server for 2.5 s (longer than the TTL);
* ``black_hole``: the proxy forwards nothing for 3 s (the proxied workers are cut off).

At the end every fault is healed, submitting stops, and the soak waits until every job is
DONE or FAILED, stops the workers with SIGTERM, and checks the invariants on every job
(``tests/harness/chaos_cluster.check_job``: one commit per DONE key, rising tokens, no
acquisition inside a live lease, no accepted stale write) and that no FAILED job has a
commit. Exit status 0 when all hold. Histories stay in ``--keep DIR`` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ai_lease import LeaseStore, Status, open_store
from ai_lease.job import Job
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from tests.harness.chaos_cluster import check_job, key_view
from tests.harness.chaos_proxy import ChaosProxy
from tests.harness.history import of_kind
from tests.harness.node import NodeProcess
from tests.harness.redis_server import RedisServer
from tests.harness.worker_proc import Workers

__all__ = ["SoakOptions", "SoakResult", "main", "soak"]

TTL, RENEW, SWEEP = 2.0, 0.5, 0.2
FAULTS = ("kill", "pause", "term", "redis_pause", "black_hole")


@dataclass
class SoakOptions:
    seconds: float = 60.0
    workers: int = 3
    fault_every: float = 10.0
    rate: float = 2.0
    seed: int | None = None
    keep: Path | None = None
    drain_timeout: float = 90.0


@dataclass
class SoakResult:
    jobs: int = 0
    done: int = 0
    failed: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0  # acquisitions by another node ("(takeover)" in the detail)
    reattempts: int = 0  # acquisitions after a DONE job's first: takeovers and same-node retries
    unacknowledged: int = 0  # commits that landed without their owner hearing back
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        faults = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"soak: {self.jobs} jobs, {self.done} DONE, {self.failed} FAILED, "
            f"{self.reattempts} re-attempts ({self.takeovers} takeovers), "
            f"{self.unacknowledged} unacknowledged commits; "
            f"faults: {faults}; "
            f"{len(self.violations)} invariant violations"
        )


class Soak:
    def __init__(self, options: SoakOptions, redis: RedisServer, proxy: ChaosProxy, where: Path):
        self.options, self.redis, self.proxy, self.where = options, redis, proxy, where
        self.random = random.Random(options.seed)
        self.direct = Workers(redis.url, where, ttl=TTL, renew=RENEW, sweep=SWEEP)
        self.proxied = Workers(proxy.url_for(), where, ttl=TTL, renew=RENEW, sweep=SWEEP)
        self.live: list[NodeProcess] = []
        self.serial = 0
        self.keys: list[str] = []
        self.result = SoakResult()

    async def start_worker(self) -> None:
        self.serial += 1
        group = self.proxied if self.serial % 2 == 0 else self.direct
        name = f"W{self.serial}{'p' if group is self.proxied else ''}"
        self.live.append(await group.start_ready(name, concurrency=4, job_seconds=1.0))

    async def submit_jobs(self, store: LeaseStore, until: float) -> None:
        runner = Runner(store, config=RunConfig(record_history=False, trace=False))
        while time.monotonic() < until:
            key = f"soak-{len(self.keys):05d}"
            with contextlib.suppress(Exception):  # a fault may hit the submitter too
                await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))
                self.keys.append(key)
            await asyncio.sleep(1.0 / self.options.rate)

    async def strike(self) -> None:
        fault = self.random.choice(FAULTS)
        self.result.faults[fault] += 1
        victim = self.random.choice(self.live)
        print(f"  {time.strftime('%H:%M:%S')} fault {fault} ({victim.name})", flush=True)
        if fault == "kill":
            victim.signal(signal.SIGKILL)
            await victim.process.wait()
            self.live.remove(victim)
            await self.start_worker()
        elif fault == "term":
            victim.signal(signal.SIGTERM)
            with contextlib.suppress(AssertionError):
                await victim.exited(30)
            await victim.kill()
            self.live.remove(victim)
            await self.start_worker()
        elif fault == "pause":
            victim.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(3.0)
            finally:
                victim.signal(signal.SIGCONT)
        elif fault == "redis_pause":
            self.redis.pause()
            try:
                await asyncio.sleep(2.5)
            finally:
                self.redis.resume()
        else:
            self.proxy.black_hole()
            try:
                await asyncio.sleep(3.0)
            finally:
                self.proxy.heal()

    async def faults(self, until: float) -> None:
        while True:
            wait = self.options.fault_every * self.random.uniform(0.5, 1.5)
            if time.monotonic() + wait >= until:
                return
            await asyncio.sleep(wait)
            await self.strike()

    async def drain(self, store: LeaseStore) -> None:
        deadline = time.monotonic() + self.options.drain_timeout
        left = set(self.keys)
        while left and time.monotonic() < deadline:
            for key in sorted(left):
                record = await store.get(key)
                if record is not None and record.status.terminal:
                    left.discard(key)
            await asyncio.sleep(0.2)
        for key in sorted(left):
            self.result.violations.append(
                f"{key} not DONE/FAILED {self.options.drain_timeout}s after the end"
            )

    async def stop_workers(self) -> None:
        for proc in self.live:
            if proc.running:
                proc.signal(signal.SIGTERM)
        for proc in self.live:
            with contextlib.suppress(AssertionError):
                await proc.exited(30)

    async def check(self, store: LeaseStore) -> None:
        histories = {**self.direct.histories(), **self.proxied.histories()}
        self.result.jobs = len(self.keys)
        for key in self.keys:
            record = await store.get(key)
            if record is None or not record.status.terminal:
                continue
            if record.status is Status.FAILED:
                self.result.failed += 1
                view = key_view(histories, key)
                commits = [e for h in view.values() for e in of_kind(h, "committed")]
                if commits:
                    self.result.violations.append(f"{key} FAILED but has commits {commits}")
                continue
            try:
                verdict = await check_job(
                    self.redis.url, key, histories, ttl=TTL, unacknowledged_ok=True
                )
            except AssertionError as exc:
                self.result.violations.append(f"{key}: {str(exc)[:3000]}")
                continue
            self.result.done += 1
            self.result.unacknowledged += verdict.committer["kind"] == "acquired"
            self.result.takeovers += sum("(takeover)" in e["detail"] for e in verdict.acquisitions)
            self.result.reattempts += max(0, len(verdict.acquisitions) - 1)

    async def run(self) -> SoakResult:
        store = open_store(self.redis.url, op_timeout=2.0)
        try:
            for _ in range(self.options.workers):
                await self.start_worker()
            until = time.monotonic() + self.options.seconds
            await asyncio.gather(self.submit_jobs(store, until), self.faults(until))
            self.proxy.heal()
            await self.drain(store)
            await self.stop_workers()
            await self.check(store)
        finally:
            await self.direct.aclose()
            await self.proxied.aclose()
            await store.aclose()
        return self.result


async def soak(options: SoakOptions) -> SoakResult:
    """Run one soak (see the module docstring) and return what it found."""
    where = options.keep or Path(tempfile.mkdtemp(prefix="ai_lease-soak-"))
    where.mkdir(parents=True, exist_ok=True)
    try:
        with RedisServer() as redis:
            async with ChaosProxy(redis.host, redis.port, seed=options.seed) as proxy:
                return await Soak(options, redis, proxy, where).run()
    finally:
        if options.keep is None:
            shutil.rmtree(where, ignore_errors=True)


def parse_args(argv: Sequence[str]) -> SoakOptions:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--fault-every", type=float, default=10.0, help="seconds, on average")
    parser.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep histories in this folder")
    args = parser.parse_args(argv)
    if args.workers < 2:
        parser.error("--workers: at least 2 (one must survive each fault)")
    return SoakOptions(
        seconds=args.minutes * 60,
        workers=args.workers,
        fault_every=args.fault_every,
        rate=args.rate,
        seed=args.seed,
        keep=args.keep,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    print(
        f"soak: {options.seconds:g}s, {options.workers} workers, a fault every "
        f"~{options.fault_every:g}s, seed {options.seed}",
        flush=True,
    )
    result = asyncio.run(soak(options))
    print(result.summary())
    for violation in result.violations[:20]:
        print(f"VIOLATION {violation}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
