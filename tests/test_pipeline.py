"""Stages and the pipeline: deadlines, sync stages in threads, outputs, and the default stages."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ai_lease.errors import JobSpecError, ProviderError, StageDeadlineExceeded
from ai_lease.job import Job, Status
from ai_lease.lease import Acquired
from ai_lease.lease.events import Event
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import Provider
from ai_lease.providers.local import LocalExtractiveProvider, extractive_summary
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider
from ai_lease.timeouts import LeaseTimings

TEXT = (
    "The river flooded the valley in spring. Farmers moved their cattle to the hills. "
    "The flood destroyed the old bridge over the river. Engineers built a new bridge in summer. "
    "The valley recovered by autumn and the river returned to its banks."
)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "s.db")
    yield store
    await store.aclose()


class Harness:
    """Builds a StageContext over a real store and a real acquired fence."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store
        self.events: list[Event] = []

    async def context(
        self, job: Job | None = None, provider: Provider | None = None
    ) -> StageContext:
        job = job or Job("job-1", input=TEXT)
        outcome = await self.store.acquire(job.key, "owner-A", ttl=30, max_no_progress=5)
        assert isinstance(outcome, Acquired)
        tracker = Progress()
        keeper = LeaseKeeper(
            self.store, outcome.fence, tracker, LeaseTimings(), valid_until=tracker.clock() + 30
        )
        return StageContext(job, outcome.fence, self.store, tracker, keeper, provider=provider)

    async def run(self, pipeline: Pipeline, ctx: StageContext) -> Any:
        return await pipeline.run(ctx, LeaseTimings(), self.events.append)


@pytest.fixture
def harness(store: SQLiteStore) -> Harness:
    return Harness(store)


# -- stages and the pipeline -------------------------------------------------------------------


async def test_stage_past_its_deadline_raises_naming_stage_and_deadline(harness: Harness) -> None:
    """An async stage that outruns its hard deadline raises StageDeadlineExceeded."""

    async def slow(ctx: StageContext) -> None:
        # real: beside a SQLite store (its thread); never waited out, a deadline cuts it
        await asyncio.sleep(10)

    ctx = await harness.context()
    started = time.monotonic()
    with pytest.raises(StageDeadlineExceeded) as info:
        await harness.run(Pipeline([Stage("slow", slow, deadline=0.2)]), ctx)
    assert time.monotonic() - started < 2.0
    assert (info.value.stage, info.value.budget_s) == ("slow", 0.2)
    assert "'slow'" in str(info.value)


async def test_each_stage_gets_its_own_deadline_sooner_or_later_than_the_last(
    harness: Harness,
) -> None:
    """Stage deadlines share one timer: a stage with a later deadline than the one before
    is not cut at the earlier one, and a later stage with a sooner deadline is cut on time."""

    async def naps(ctx: StageContext) -> str:
        # real: beside a SQLite store (its thread); 0.3 s outlives the first stage's deadline
        await asyncio.sleep(0.3)
        return "slept"

    async def quick(ctx: StageContext) -> None:
        return None

    async def stuck(ctx: StageContext) -> None:
        # real: beside a SQLite store (its thread); never waited out, a deadline cuts it
        await asyncio.sleep(10)

    ctx = await harness.context()
    first = Pipeline([Stage("quick", quick, deadline=0.1), Stage("naps", naps, deadline=5.0)])
    assert await harness.run(first, ctx) == "slept"
    ctx = await harness.context()
    later = [Stage("quick", quick, deadline=5.0), Stage("stuck", stuck, deadline=0.2)]
    started = time.monotonic()
    with pytest.raises(StageDeadlineExceeded) as info:
        await harness.run(Pipeline(later), ctx)
    assert time.monotonic() - started < 2.0 and info.value.stage == "stuck"


async def test_stage_own_timeout_error_is_not_a_deadline(harness: Harness) -> None:
    """A TimeoutError raised by the stage's own code propagates as itself."""

    async def own_timeout(ctx: StageContext) -> None:
        async with asyncio.timeout(0.05):
            # real: beside a SQLite store (its thread); never waited out, a deadline cuts it
            await asyncio.sleep(10)

    ctx = await harness.context()
    with pytest.raises(TimeoutError) as info:
        await harness.run(Pipeline([Stage("fetch", own_timeout, deadline=5.0)]), ctx)
    assert not isinstance(info.value, StageDeadlineExceeded)


async def test_stage_raising_timeout_error_directly_is_not_a_deadline(harness: Harness) -> None:
    """A bare `raise TimeoutError` in a stage is not reported as the stage's deadline."""

    async def boom(ctx: StageContext) -> None:
        raise TimeoutError("upstream said so")

    ctx = await harness.context()
    with pytest.raises(TimeoutError, match="upstream said so"):
        await harness.run(Pipeline([Stage("fetch", boom, deadline=5.0)]), ctx)


async def test_sync_stage_runs_in_a_worker_thread(harness: Harness) -> None:
    """A plain function runs off the loop's thread, with thread_ident set while it runs."""
    seen: dict[str, Any] = {}

    def crunch(ctx: StageContext) -> int:
        seen["ident"] = threading.get_ident()
        seen["tracked"] = ctx.tracker.thread_ident
        return 42

    ctx = await harness.context()
    result = await harness.run(Pipeline([Stage("crunch", crunch)]), ctx)
    assert result == 42
    assert ctx.outputs["crunch"] == 42
    assert seen["ident"] != threading.get_ident()
    assert seen["tracked"] == seen["ident"]
    assert ctx.tracker.thread_ident is None


async def test_async_stage_runs_on_the_loop_thread(harness: Harness) -> None:
    """An async stage runs on the event loop's thread, with no worker thread recorded."""
    seen: dict[str, Any] = {}

    async def quick(ctx: StageContext) -> str:
        seen["ident"] = threading.get_ident()
        seen["tracked"] = ctx.tracker.thread_ident
        return "ok"

    ctx = await harness.context()
    assert await harness.run(Pipeline([Stage("quick", quick)]), ctx) == "ok"
    assert seen == {"ident": threading.get_ident(), "tracked": None}


async def test_stages_run_in_order_and_see_earlier_outputs(harness: Harness) -> None:
    """Each stage's return value is available to later stages through ctx.output."""
    order: list[str] = []

    async def first(ctx: StageContext) -> list[int]:
        order.append("first")
        return [1, 2, 3]

    def second(ctx: StageContext) -> int:
        order.append("second")
        return sum(ctx.output("first"))

    async def third(ctx: StageContext) -> str:
        order.append("third")
        return f"{ctx.output('first')} -> {ctx.output('second')}"

    pipeline = Pipeline([Stage("first", first), Stage("second", second), Stage("third", third)])
    ctx = await harness.context()
    result = await harness.run(pipeline, ctx)
    assert order == ["first", "second", "third"]
    assert result == "[1, 2, 3] -> 6"
    assert ctx.outputs == {"first": [1, 2, 3], "second": 6, "third": result}
    assert [e.stage for e in harness.events if e.kind == "stage"] == order


async def test_entering_each_stage_is_progress(harness: Harness) -> None:
    """The tracker moves to each stage in turn, one version step per stage entered."""
    stages_seen: list[str | None] = []

    async def note(ctx: StageContext) -> None:
        stages_seen.append(ctx.tracker.stage)

    ctx = await harness.context()
    before = ctx.tracker.version
    await harness.run(Pipeline([Stage("a", note), Stage("b", note)]), ctx)
    assert stages_seen == ["a", "b"]
    assert ctx.tracker.version == before + 2


async def test_output_of_a_missing_stage_is_a_job_spec_error(harness: Harness) -> None:
    """Asking for a stage output that does not exist raises JobSpecError naming it."""

    async def reads_missing(ctx: StageContext) -> Any:
        return ctx.output("nowhere")

    ctx = await harness.context()
    with pytest.raises(JobSpecError, match="'nowhere'"):
        await harness.run(Pipeline([Stage("reads", reads_missing)]), ctx)


def test_pipeline_with_duplicate_stage_names_is_refused() -> None:
    """Two stages with one name make an invalid pipeline."""

    async def noop(ctx: StageContext) -> None:
        return None

    with pytest.raises(JobSpecError, match="unique"):
        Pipeline([Stage("a", noop), Stage("b", noop), Stage("a", noop)])


def test_empty_pipeline_is_refused() -> None:
    """A pipeline needs at least one stage."""
    with pytest.raises(JobSpecError):
        Pipeline([])


def test_replace_of_an_unknown_stage_is_refused() -> None:
    """Pipeline.replace names the missing stage and leaves the pipeline as it was."""

    async def noop(ctx: StageContext) -> None:
        return None

    pipeline = Pipeline.default()
    with pytest.raises(JobSpecError, match="'enrich'"):
        pipeline.replace("enrich", Stage("enrich", noop))
    assert [s.name for s in pipeline.stages] == [
        "load",
        "build_prompt",
        "call_ai",
        "parse",
        "persist",
    ]


def test_replace_swaps_one_stage_in_a_copy() -> None:
    """replace returns a new pipeline with the named stage swapped and the order kept."""

    async def noop(ctx: StageContext) -> None:
        return None

    original = Pipeline.default()
    changed = original.replace("parse", Stage("parse", noop))
    assert [s.name for s in changed.stages] == [s.name for s in original.stages]
    assert changed.stages[3].fn is noop
    assert original.stages[3].fn is not noop


def test_stage_budget_overrides_and_falls_back_to_settings() -> None:
    """A stage's own budgets win; budgets left None come from the settings for its name."""

    async def noop(ctx: StageContext) -> None:
        return None

    timings = LeaseTimings()
    assert Stage("call_ai", noop).budget(timings) == timings.budget("call_ai")
    custom = Stage("call_ai", noop, max_no_progress=3, deadline=7).budget(timings)
    assert (custom.max_no_progress, custom.deadline) == (3.0, 7.0)


# -- the default stages end to end -------------------------------------------------------------


async def test_default_pipeline_commits_the_summary(harness: Harness, store: SQLiteStore) -> None:
    """load → build_prompt → call_ai → parse → persist commits the model's answer."""
    ctx = await harness.context(provider=LocalExtractiveProvider(pace_s=0))
    result = await harness.run(Pipeline.default(), ctx)
    expected = extractive_summary(TEXT)
    assert result == expected
    record = await store.get("job-1")
    assert record is not None
    assert record.status is Status.DONE
    assert record.output == expected
    assert ctx.committed is not None and ctx.committed.status is Status.DONE


async def test_default_pipeline_without_streaming_commits_too(
    harness: Harness, store: SQLiteStore
) -> None:
    """A job with stream=False completes in one call and commits the same answer."""
    job = Job("job-1", input=TEXT, stream=False)
    ctx = await harness.context(job, LocalExtractiveProvider(pace_s=0))
    await harness.run(Pipeline.default(), ctx)
    record = await store.get("job-1")
    assert record is not None and record.output == extractive_summary(TEXT)


@pytest.mark.parametrize(
    "answer",
    [
        ['{"a": 1}'],
        ["```json\n", '{"a"', ": 1}", "\n```"],
        ["  ```\n", '{"a": 1}', "\n```  "],
    ],
    ids=["bare", "json-fence", "plain-fence"],
)
async def test_json_output_is_parsed_and_committed(
    harness: Harness, store: SQLiteStore, answer: list[str]
) -> None:
    """A job with output='json' commits the decoded JSON value, fenced or not."""
    job = Job("job-1", input=TEXT, output="json")
    ctx = await harness.context(job, ScriptedProvider(answer))
    assert await harness.run(Pipeline.default(), ctx) == {"a": 1}
    record = await store.get("job-1")
    assert record is not None
    assert record.status is Status.DONE
    assert record.output == {"a": 1}


async def test_garbage_json_is_retryable_and_writes_nothing(
    harness: Harness, store: SQLiteStore
) -> None:
    """A non-JSON answer raises a retryable ProviderError; the record stays RUNNING, no result."""
    job = Job("job-1", input=TEXT, output="json")
    ctx = await harness.context(job, ScriptedProvider(["Sure! Here is the JSON: {a: 1"]))
    with pytest.raises(ProviderError) as info:
        await harness.run(Pipeline.default(), ctx)
    assert info.value.retryable is True
    assert "persist" not in ctx.outputs
    record = await store.get("job-1")
    assert record is not None
    assert record.status is Status.RUNNING
    assert record.result is None


async def test_call_ai_without_a_provider_is_a_job_spec_error(
    harness: Harness, store: SQLiteStore
) -> None:
    """The default pipeline with no provider stops at call_ai and commits nothing."""
    ctx = await harness.context(provider=None)
    with pytest.raises(JobSpecError, match="no provider"):
        await harness.run(Pipeline.default(), ctx)
    record = await store.get("job-1")
    assert record is not None and record.result is None
