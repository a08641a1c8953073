"""Fault points: where they are in the pipeline, and what each action does."""

from __future__ import annotations

import asyncio
import time

import pytest

from ai_lease import LeaseStore, LeaseTimings, StageBudget, Status
from ai_lease.job import Job
from ai_lease.runner import Runner
from ai_lease.testing.faults import FaultPlan
from ai_lease.testing.scripted import ScriptedProvider


async def test_points_are_hit_in_pipeline_order(store: LeaseStore) -> None:
    """Every named point is passed once, in order, around stages and the commit."""
    seen: list[str] = []
    names = [
        f"{w}:{s}"
        for s in ("load", "build_prompt", "call_ai", "parse", "persist")
        for w in ("before", "after")
    ]
    plan = FaultPlan(
        dict.fromkeys([*names, "before_commit", "after_commit"], "block:0"),
        on_hit=lambda point, action: seen.append(point),
    )
    await Runner(store, provider=ScriptedProvider(["x"]), faults=plan).run(Job("k", input="x"))
    assert seen.index("before:persist") < seen.index("before_commit")
    assert seen.index("before_commit") < seen.index("after_commit") < seen.index("after:persist")
    assert sorted(seen) == sorted([*names, "before_commit", "after_commit"])


def test_unknown_action_is_refused() -> None:
    """A typo in a fault plan fails loudly instead of silently doing nothing."""
    with pytest.raises(ValueError, match="unknown action"):
        FaultPlan.parse("before_commit=explode")


async def test_blocked_loop_past_ttl_abandons_before_the_write(store: LeaseStore) -> None:
    """A sync sleep longer than the TTL blocks the keeper too: on wake the owner abandons
    the job before any side effect (no commit from it)."""
    timings = LeaseTimings(
        ttl=1.0,
        renew_interval=0.2,
        op_timeout=0.15,
        poll_interval=0.05,
        self_fence_margin=0.2,
        stage_budgets={"parse": StageBudget(30, 60)},
    )
    plan = FaultPlan({"after:parse": "block:1.5"})
    events: list[str] = []
    runner = Runner(
        store,
        provider=ScriptedProvider(["x"]),
        timings=timings,
        faults=plan,
        on_event=lambda e: events.append(e.kind),
    )
    started = time.monotonic()
    task = asyncio.create_task(runner.run(Job("k", input="x")))
    record = await asyncio.wait_for(task, 20)
    assert record.status is Status.DONE and record.attempts == 2, "the second attempt wrote"
    assert events.count("committed") == 1 and "self_fenced" in events
    assert events.index("self_fenced") < events.index("committed")
    assert time.monotonic() - started >= 1.5
