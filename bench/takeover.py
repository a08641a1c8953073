"""Takeover latency after an owner stalls, dies or freezes, under the expire and release policies.

    .venv/bin/python bench/takeover.py               # 5 runs per case, 6 cases (~2-3 min)
    .venv/bin/python bench/takeover.py --runs 10 --cases stall

Run from the repository root in the dev environment (``pip install -e '.[dev]'``; needs the
``redis-server`` binary). It starts its own ``redis-server`` (tests/harness).

Each run: a fresh job key; the **owner** is a child process (this script with ``--child``)
running ``Runner.run`` on a ``RedisStore``; once it reports ``acquired``, this process starts a
**follower** ``Runner.run`` on the same job. The fault, in the owner:

* ``stall``  the model streams a chunk, then hangs (a zombie: process and heartbeat alive);
* ``kill``   ``FaultPlan`` SIGKILLs the owner at ``after:call_ai`` (a dead node);
* ``pause``  ``FaultPlan`` SIGSTOPs the owner at ``after:call_ai`` (a frozen VM, a GC pause).

So that the fault lands at a random phase of the renewal cycle, the model first streams a
chunk, pauses a random 0-1 s (two renew intervals, under max_no_progress) and streams one more.

The owner prints the wall-clock instant of the fault (the hang starts after the chunk was
counted as progress); latency = the follower's ``acquired`` event (``Event.at``) minus that
instant, on the same host clock. Fast timings: TTL 2 s, renew 0.5 s, op timeout 0.4 s, poll
0.1 s, max_no_progress 1 s. The bound per case: dead or frozen owner TTL + poll + 0.5 s;
zombie under ``expire`` max_no_progress + renew + TTL + poll + 0.5 s; zombie under ``release``
below one TTL (it steps down as soon as the stall is seen).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from ai_lease import Job, LeaseTimings, Runner, StageBudget, StallPolicy
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.stores.redis.store import RedisStore
from ai_lease.testing.faults import FaultPlan
from ai_lease.testing.scripted import Pause, ScriptedProvider
from tests.harness.redis_server import RedisServer

TTL, RENEW, OP, POLL, MNP = 2.0, 0.5, 0.4, 0.1, 1.0
STAGES = ("load", "build_prompt", "call_ai", "parse", "persist")
CASES = [(f, p) for f in ("stall", "kill", "pause") for p in ("expire", "release")]
RUN_TIMEOUT_S = 30.0


def timings(policy: str) -> LeaseTimings:
    return LeaseTimings(
        ttl=TTL,
        renew_interval=RENEW,
        op_timeout=OP,
        poll_interval=POLL,
        self_fence_margin=TTL / 4,
        stall_policy=StallPolicy(policy),
        stage_budgets={name: StageBudget(MNP, 30.0) for name in STAGES},
    )


def bound(fault: str, policy: str) -> float:
    if fault != "stall":
        return TTL + POLL + 0.5
    return TTL if policy == "release" else MNP + RENEW + TTL + POLL + 0.5


def job(key: str) -> Job:
    return Job(key, input="x", prompt_text="{{ input }}")


# -- the owner (child process) -----------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


class HangingProvider:
    """Two content chunks ``offset`` apart, then the stream hangs: the zombie's stuck call."""

    name = "hanging"

    def __init__(self, offset: float) -> None:
        self.offset = offset

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        yield Delta(text="partial ")
        await asyncio.sleep(self.offset)
        yield Delta(text="answer ")
        say(f"FAULT {time.time()}")  # the guard has counted the chunk: progress stops here
        await asyncio.Event().wait()

    async def complete(self, request: ChatRequest) -> Completion:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def owner(fault: str, policy: str, url: str, ns: str, key: str, offset: str) -> None:
    store = RedisStore.from_url(url, namespace=ns, op_timeout=OP)
    plan = None
    if fault != "stall":
        plan = FaultPlan({"after:call_ai": fault}, on_hit=lambda p, a: say(f"FAULT {time.time()}"))

    def on_event(event: Event) -> None:
        if event.kind in ("acquired", "stalled", "released"):
            say(f"EVENT {event.kind} {event.at}")

    provider: Any = HangingProvider(float(offset))
    if fault != "stall":
        provider = ScriptedProvider(["partial ", Pause(float(offset)), "answer"])
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(
            timings=timings(policy), node_id="owner", record_history=False, trace=False
        ),
        hooks=RunHooks(fault=plan, on_event=on_event),
    )
    try:
        await runner.run(job(key))
    finally:
        await store.aclose()


# -- the measuring side --------------------------------------------------------------------------


async def one_run(fault: str, policy: str, url: str, ns: str) -> dict[str, float]:
    key = f"takeover-{fault}-{policy}-{uuid.uuid4().hex[:8]}"
    args = ["--child", fault, policy, url, ns, key, str(random.uniform(0, 2 * RENEW))]
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdout is not None
    seen: dict[str, float] = {}

    async def read_child() -> None:
        assert child.stdout is not None
        async for raw in child.stdout:
            kind, *rest = raw.decode().split()
            seen.setdefault(rest[0] if kind == "EVENT" else "fault", float(rest[-1]))
            if "acquired" in seen:
                started.set()

    started, acquired_at = asyncio.Event(), []
    store = RedisStore.from_url(url, namespace=ns, op_timeout=OP)

    def on_event(event: Event) -> None:
        if event.kind == "acquired":
            acquired_at.append(event.at)

    follower = Runner(
        store,
        provider=ScriptedProvider(["ok"]),
        config=RunConfig(
            timings=timings(policy), node_id="follower", record_history=False, trace=False
        ),
        hooks=RunHooks(on_event=on_event),
    )
    reader = asyncio.create_task(read_child())
    try:
        async with asyncio.timeout(RUN_TIMEOUT_S):
            await started.wait()
            record = await follower.run(job(key))
    finally:
        if child.returncode is None:
            child.kill()  # SIGKILL also ends a stopped (paused) process
        await child.wait()
        reader.cancel()
        await store.aclose()
    if record.owner_id is None or not record.owner_id.startswith("follower"):
        raise RuntimeError(f"bench: {key} was committed by {record.owner_id}, not the follower")
    out = {"latency": acquired_at[0] - seen["fault"]}
    if "stalled" in seen:
        out["detected"] = seen["stalled"] - seen["fault"]
    return out


def pct(xs: list[float], q: float) -> float:
    if q == 0.5:
        return statistics.median(xs)
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(args: argparse.Namespace, url: str) -> tuple[list[str], list[tuple[bool, str]]]:
    ns, results, verdicts = f"bench-{uuid.uuid4().hex[:8]}", [], []
    print(
        f"\n{'fault':<6} {'policy':<8} {'runs':>4} {'p50 s':>6} {'p99 s':>6} {'max s':>6} "
        f"{'bound s':>7} {'max/bound':>9}  stall seen after (s, p50)"
    )
    for fault, policy in CASES:
        if args.cases and fault not in args.cases.split(","):
            continue
        runs = [await one_run(fault, policy, url, ns) for _ in range(args.runs)]
        lat = [r["latency"] for r in runs]
        limit, worst = bound(fault, policy), max(lat)
        detected = [r["detected"] for r in runs if "detected" in r]
        seen = f"{statistics.median(detected):.2f}" if detected else "-"
        print(
            f"{fault:<6} {policy:<8} {len(lat):>4} {pct(lat, 0.5):6.2f} {pct(lat, 0.99):6.2f} "
            f"{worst:6.2f} {limit:7.2f} {worst / limit:9.2f}  {seen}"
        )
        name = f"{fault}_{policy}"
        for q, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
            results.append(f"RESULT takeover_{name}_{label}_s {pct(lat, q):.3f}")
        results.append(f"RESULT ratio_takeover_{name}_max_vs_bound {worst / limit:.3f}")
        ok = worst < limit if (fault, policy) == ("stall", "release") else worst <= limit
        rel = "<" if (fault, policy) == ("stall", "release") else "<="
        verdicts.append((ok, f"takeover_{name}_every_run{rel}{limit:g}s (max {worst:.3f}s)"))
    return results, verdicts


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        asyncio.run(owner(*sys.argv[2:8]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=5, help="runs per case")
    p.add_argument("--cases", default="", help="comma-separated faults (stall,kill,pause)")
    args = p.parse_args()
    print(
        f"takeover: {args.runs} runs per case; TTL {TTL:g} s, renew {RENEW:g} s, op {OP:g} s, "
        f"poll {POLL:g} s, max_no_progress {MNP:g} s; Python {sys.version.split()[0]}"
    )
    with RedisServer() as server:
        results, verdicts = asyncio.run(measure(args, server.url))
    print("\n" + "\n".join(results) + "\n")
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
