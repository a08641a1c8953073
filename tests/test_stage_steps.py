"""ctx.stage(name): a named step inside a running stage, in the events and the keeper's view."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ai_lease.job import Job
from ai_lease.lease import Acquired
from ai_lease.lease.events import Event
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.lease.progress import Progress
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import LeaseTimings


@pytest.fixture
async def ctx(tmp_path: Path) -> AsyncIterator[StageContext]:
    store = SQLiteStore(tmp_path / "s.db")
    outcome = await store.acquire("job-1", "owner-A", ttl=30, max_no_progress=5)
    assert isinstance(outcome, Acquired)
    tracker = Progress()
    keeper = LeaseKeeper(
        store, outcome.fence, tracker, LeaseTimings(), valid_until=tracker.clock() + 30
    )
    yield StageContext(Job("job-1", input="text"), outcome.fence, store, tracker, keeper)
    await store.aclose()


async def test_a_step_is_named_in_events_and_the_tracker_then_hands_back(
    ctx: StageContext,
) -> None:
    events: list[Event] = []
    seen: list[tuple[str | None, float]] = []

    async def rank(ctx: StageContext) -> str:
        async with ctx.stage("rerank", max_no_progress=7):
            seen.append((ctx.tracker.stage, ctx.tracker.budget.max_no_progress))
            ctx.progress(1)
        seen.append((ctx.tracker.stage, ctx.tracker.budget.max_no_progress))
        return "ranked"

    pipeline = Pipeline([Stage("rank", rank, max_no_progress=20)])
    before = ctx.tracker.version
    assert await pipeline.run(ctx, LeaseTimings(), events.append) == "ranked"
    assert seen == [("rerank", 7), ("rank", 20)]  # the step's budget, then the stage's again
    # entering the stage, entering the step, one marker, back in the stage: all progress
    assert ctx.tracker.version == before + 4
    steps = [(e.kind, e.stage, (e.attrs or {}).get("within")) for e in events]
    assert steps == [
        ("stage", "rank", None),
        ("stage", "rerank", "rank"),
        ("stage_done", "rerank", "rank"),
        ("stage_done", "rank", None),
    ]
    done = next(e for e in events if e.kind == "stage_done" and e.stage == "rerank")
    assert done.value is not None and done.value >= 0
    assert "rerank" not in ctx._run.ran["stage_durations"]  # the record keeps stages only


async def test_a_step_without_a_budget_keeps_the_stages_and_a_failed_one_says_no_done(
    ctx: StageContext,
) -> None:
    events: list[Event] = []

    async def rank(ctx: StageContext) -> None:
        async with ctx.stage("fetch"):
            assert ctx.tracker.budget.max_no_progress == 20
            raise ValueError("no rows")

    with pytest.raises(ValueError, match="no rows"):
        await Pipeline([Stage("rank", rank, max_no_progress=20)]).run(
            ctx, LeaseTimings(), events.append
        )
    assert ctx.tracker.stage == "rank"  # handed back to the stage around it
    assert [(e.kind, e.stage) for e in events] == [("stage", "rank"), ("stage", "fetch")]
