"""``rpm`` under ``[limits]`` (issue 29, rates): at most ``rpm`` model calls of a limit start
in any minute, fleet-wide. Each call takes a place in the limit's window just before it sends;
the place is never given back and lapses a minute (and a second) later. A call past the
window waits its turn (said, and not charged to the call) until a place lapses.

The store's clock is jumped past the window instead of waiting a minute; the measured fleet
run against a server that answers 429 is tests/test_limits_rate_fleet.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ai_lease import LeaseTimings, RetryPolicy, StageBudget
from ai_lease.job import Job
from ai_lease.lease.call_limits import RATE_WINDOW_S, CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider

REAL_TIME = "the store answers from its own thread; its clock is jumped, not waited for"

LIMIT = CallLimit("scripted", rpm=2, max_wait=30)
TIMINGS = LeaseTimings(
    ttl=300.0,  # the store's clock jumps a minute ahead: the jobs' leases must outlast it
    renew_interval=0.5,
    op_timeout=0.4,
    poll_interval=0.05,
    self_fence_margin=0.5,
    stage_budgets={"call_ai": StageBudget(10, 1.0)},
)


class Clock:
    """The store's clock: the wall clock plus a jump a test makes."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[tuple[SQLiteStore, Clock]]:
    clock = Clock()
    store = SQLiteStore(tmp_path / "rpm.db", poll_interval=0.05, clock=clock)
    yield store, clock
    await store.aclose()


async def test_rpm_calls_start_then_the_next_waits_for_the_window(
    store: tuple[SQLiteStore, Clock],
) -> None:
    """rpm = 2: two of three jobs call at once; the third waits (past call_ai's 1 s hard
    deadline, which the wait does not use up) until a place lapses, then runs whole."""
    sqlite, clock = store
    events: list[Event] = []
    config = RunConfig(timings=TIMINGS, retry=RetryPolicy(attempts=1), limits=CallLimits((LIMIT,)))
    runner = Runner(
        sqlite, provider=ScriptedProvider(["ok"]), config=config, hooks=RunHooks(events.append)
    )
    jobs = {k: asyncio.ensure_future(runner.run(Job(k, input="x"))) for k in ("a", "b", "c")}
    await asyncio.sleep(1.5)  # real: two calls run, the third waits for the window
    done = {k for k, job in jobs.items() if job.done()}
    assert len(done) == 2, done
    (late,) = set(jobs) - done
    waits = [e for e in events if e.kind == "slot_wait" and e.key == late]
    assert [e.detail for e in waits] == ["waiting for a slot of scripted (rpm 2, 0 ahead)"]
    assert (await sqlite.slot_state("scripted~rpm")).in_use == 2
    clock.offset += RATE_WINDOW_S  # a minute and a second later: both places lapsed
    record = await asyncio.wait_for(jobs[late], 10)
    assert record.output == "ok"
    taken = [e for e in events if e.kind == "slot_taken"]
    assert [e.detail for e in taken] == ["a slot of scripted (rpm 2)"] * 3
    assert (await sqlite.slot_state("scripted~rpm")).in_use == 1  # the late one's, for a minute


async def test_a_place_in_the_window_is_not_given_back(store: tuple[SQLiteStore, Clock]) -> None:
    """A call that ended still counts in the window: rpm = 2 and two calls done, a third
    started within the minute waits; nothing was released."""
    sqlite, _ = store
    config = RunConfig(timings=TIMINGS, retry=RetryPolicy(attempts=1), limits=CallLimits((LIMIT,)))
    runner = Runner(sqlite, provider=ScriptedProvider(["ok"]), config=config)
    for key in ("p", "q"):
        assert (await runner.run(Job(key, input="x"))).output == "ok"
    assert (await sqlite.slot_state("scripted~rpm")).in_use == 2
    third = asyncio.ensure_future(runner.run(Job("r", input="x")))
    await asyncio.sleep(1.0)  # real: the third waits for a place in the window
    assert not third.done()
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
