"""What a `[limits]` slot costs a job, side by side in one run: the same short job through
``Runner.run`` with no limit, with a limit that matches nothing, and with a matching limit
(capacity above the concurrency, so no call waits: the cost of taking and giving back a slot).

    .venv/bin/python bench/limits_cost.py                  # 2,000 jobs per variant, 3 rounds
    .venv/bin/python bench/limits_cost.py --jobs 500 --concurrency 8

Run from the repository root in the dev environment (needs the ``redis-server`` binary: it
starts its own, tests/harness). Per variant: jobs/s, and on Redis the commands clients sent per
job (``INFO commandstats``, bench/_redis_stats.py) with the slot commands apart; the SQLite
variants report jobs/s only. Rounds are interleaved so a slow patch of the machine hits every
variant alike. The claims it checks (issue 29): a job no limit matches makes no extra store
call; a matching limit adds one call to take the slot and one to give it back (a call shorter
than one renew interval renews nothing); a matching ``tpm`` window adds one call to take the
place and one to reweigh it to the answer's usage (the place is never given back).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from _pair import client_for
from _redis_stats import Calls, snapshot

from ai_lease.job import Job
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.redis_server import RedisServer

VARIANTS = {
    "no limit": CallLimits(()),
    "other limit": CallLimits((CallLimit("openai:gpt-4o-mini", 1),)),
    "matching limit": CallLimits((CallLimit("scripted", 10_000),)),
    "tpm limit": CallLimits((CallLimit("scripted", tpm=1_000_000_000),)),
}


SLOT_INNER = frozenset({"pttl", "zcard", "zcount", "hincrby"})
"""What the slot scripts run inside (stores/redis/slot_scripts.py); no client here sends them."""


@dataclass
class Stats:
    jobs: int = 0
    seconds: float = 0.0
    calls: Calls = field(default_factory=Calls)

    def sent_per_job(self) -> dict[str, float]:
        sent = self.calls.sent()
        return {k: n / self.jobs for k, n in sorted(sent.items()) if k not in SLOT_INNER}


async def _drive(runner: Runner, tag: str, jobs: int, concurrency: int) -> float:
    keys = iter(range(jobs))

    async def worker() -> None:
        for n in keys:
            record = await runner.run(Job(f"{tag}:{n}", input="x", prompt_text="{{ input }}"))
            if record.output != "ok":
                raise RuntimeError(f"bench: {tag}:{n} ended with {record!r}")

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return time.perf_counter() - started


async def run(args: argparse.Namespace, url: str, tmp: Path) -> dict[str, Stats]:
    run_id = uuid.uuid4().hex[:8]
    redis = RedisStore.from_url(url, namespace=f"bench-{run_id}", op_timeout=2.0)
    sqlite = SQLiteStore(tmp / "bench.db", op_timeout=2.0)
    admin = client_for(url)  # INFO around each slice (its own commands are not counted)
    runners = {
        (store_name, name): Runner(
            store, provider=ScriptedProvider(["ok"]), config=RunConfig(limits=limits)
        )
        for store_name, store in (("redis", redis), ("sqlite", sqlite))
        for name, limits in VARIANTS.items()
    }
    results = {key: Stats() for key in runners}
    try:
        for key, runner in runners.items():  # warm up: connections, script cache, imports
            await _drive(runner, f"warm:{run_id}:{key}", 100, args.concurrency)
        for r in range(args.rounds):
            for key, runner in runners.items():
                st = results[key]
                before = await snapshot(admin)
                st.seconds += await _drive(
                    runner, f"{run_id}:{r}:{key}", args.jobs // args.rounds, args.concurrency
                )
                if key[0] == "redis":
                    st.calls.add(before, await snapshot(admin))
                st.jobs += args.jobs // args.rounds
    finally:
        await redis.aclose()
        await sqlite.aclose()
        await admin.aclose()
    return results


def report(results: dict[tuple[str, str], Stats]) -> None:
    base = {s: results[(s, "no limit")] for s in ("redis", "sqlite")}
    for (store, name), st in results.items():
        rate = st.jobs / st.seconds
        ratio = rate / (base[store].jobs / base[store].seconds)
        line = f"{store:<7} {name:<15} {rate:8.0f} jobs/s ({ratio:.2f}x no limit)"
        if store == "redis":
            sent = st.sent_per_job()
            line += f"  {sum(sent.values()):5.2f} commands/job"
            extra = {
                k: round(v - base[store].sent_per_job().get(k, 0.0), 2)
                for k, v in sent.items()
                if abs(v - base[store].sent_per_job().get(k, 0.0)) >= 0.05
            }
            line += f"  vs no limit: {extra or 'none'}"
        print(line)
    sent = {name: sum(results[("redis", name)].sent_per_job().values()) for name in VARIANTS}
    extra_other = sent["other limit"] - sent["no limit"]
    extra_matching = sent["matching limit"] - sent["no limit"]
    extra_tpm = sent["tpm limit"] - sent["no limit"]
    print(f"RESULT redis_commands_per_job_other_limit_extra {extra_other:.2f}")
    print(f"RESULT redis_commands_per_job_matching_limit_extra {extra_matching:.2f}")
    print(f"RESULT redis_commands_per_job_tpm_limit_extra {extra_tpm:.2f}")
    ok = abs(extra_other) < 0.05
    print(f"VERDICT {'ok' if ok else 'miss'} a limit that matches nothing adds no store call")
    ok = extra_matching <= 2.05
    print(f"VERDICT {'ok' if ok else 'miss'} a matching limit adds at most 2 store calls")
    ok = extra_tpm <= 2.05
    print(f"VERDICT {'ok' if ok else 'miss'} a tpm window adds at most 2 store calls")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per variant (all rounds)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(run(args, server.url, Path(tmp)))
    print(f"{args.jobs} jobs per variant, concurrency {args.concurrency}, {args.rounds} rounds")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
