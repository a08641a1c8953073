"""Fault points: where they are in the pipeline, and what each action does."""

from __future__ import annotations

import asyncio

import pytest

from ai_lease import LeaseStore, LeaseTimings, StageBudget, Status
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
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
    await Runner(store, provider=ScriptedProvider(["x"]), hooks=RunHooks(fault=plan)).run(
        Job("k", input="x")
    )
    assert seen.index("before:persist") < seen.index("before_commit")
    assert seen.index("before_commit") < seen.index("after_commit") < seen.index("after:persist")
    assert sorted(seen) == sorted([*names, "before_commit", "after_commit"])


def test_unknown_action_is_refused() -> None:
    """A typo in a fault plan fails loudly instead of silently doing nothing."""
    with pytest.raises(ValueError, match="unknown action"):
        FaultPlan.parse("before_commit=explode")


async def test_blocked_loop_past_ttl_abandons_before_the_write(store: LeaseStore) -> None:
    """A sync sleep longer than the TTL blocks the keeper too: on wake the owner abandons
    the job before any side effect; a later attempt writes the one result."""
    timings = LeaseTimings(
        ttl=2.0,
        renew_interval=0.5,
        op_timeout=0.4,
        poll_interval=0.1,
        self_fence_margin=0.5,
        stage_budgets={"parse": StageBudget(30, 60)},
    )
    plan = FaultPlan({"after:parse": "block:2.5"})
    events: list[Event] = []
    runner = Runner(
        store,
        provider=ScriptedProvider(["x"]),
        config=RunConfig(timings=timings),
        hooks=RunHooks(fault=plan, on_event=events.append),
    )
    record = await asyncio.wait_for(runner.run(Job("k", input="x")), 30)
    kinds = [e.kind for e in events]
    first_owner = next(e.owner_id for e in events if e.kind == "acquired")
    assert record.status is Status.DONE and record.owner_id != first_owner
    assert kinds.count("committed") == 1 and "self_fenced" in kinds
    assert kinds.index("self_fenced") < kinds.index("committed")
    assert not any(e.kind == "committed" and e.owner_id == first_owner for e in events)
