"""Duration history, budget suggestions, adaptive budgets and false-takeover accounting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from ai_lease import LeaseStore, LeaseTimings, StageBudget
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.lease.histogram import Histogram, bucket_of, bucket_upper
from ai_lease.observe.history import HistoryRecorder, suggest
from ai_lease.run.budgets import learned_timings
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import ScriptedProvider
from ai_lease.timeouts import AdaptiveBudgets


def test_buckets_bound_relative_error() -> None:
    """Every duration lands in a bucket whose upper edge is within ~19 % above it."""
    for seconds in (0.0015, 0.02, 0.7, 3.3, 42.0, 900.0):
        upper = bucket_upper(bucket_of(seconds))
        assert seconds <= upper <= seconds * 1.19 + 1e-9


def test_quantiles_of_a_known_distribution() -> None:
    """P50 and P99 of 100 samples 1..100 ms come out near 50 ms and 99 ms."""
    hist = Histogram()
    for ms in range(1, 101):
        hist.add(ms / 1000)
    assert 0.050 <= (hist.quantile(0.5) or 0) <= 0.060
    assert 0.099 <= (hist.quantile(0.99) or 0) <= 0.118
    assert Histogram().quantile(0.99) is None


def test_suggestion_is_max_of_floor_and_p99_times_factor() -> None:
    """max(floor, P99 x factor), and nothing for series with too few samples."""
    slow = {bucket_of(8.0): 100}
    quick = {bucket_of(0.01): 100}
    few = {bucket_of(8.0): 3}
    out = {
        s.stage: s
        for s in suggest(
            {
                ("p", "stage", "slow"): slow,
                ("p", "stage", "quick"): quick,
                ("p", "stage", "few"): few,
                ("p", "false_takeover", "slow"): {5: 2},
            },
            factor=2.0,
            floor=1.0,
            min_samples=20,
        )
    }
    assert out["slow"].suggested == pytest.approx(2 * bucket_upper(bucket_of(8.0)))
    assert out["slow"].false_takeovers == 2
    assert out["quick"].suggested == 1.0
    assert out["few"].suggested is None


def test_learned_budgets_stay_between_floor_and_ceiling() -> None:
    """Adaptive budgets tighten a well-sampled stage, never under the floor or over the
    configured budget, and leave thinly sampled stages alone."""
    configured = LeaseTimings(
        stage_budgets={
            "load": StageBudget(5, 60),
            "call_ai": StageBudget(90, 600),
            "parse": StageBudget(5, 60),
        }
    )
    histories = {
        ("default", "stage", "load"): {bucket_of(0.002): 500},  # tiny: floor wins
        ("default", "stage", "call_ai"): {bucket_of(20.0): 500},  # P99 x 1.5 ~ 30-36 s
        ("default", "stage", "parse"): {bucket_of(50.0): 500},  # over the ceiling: capped
        ("other", "stage", "load"): {bucket_of(50.0): 500},  # another pipeline: ignored
    }
    adaptive = AdaptiveBudgets(factor=1.5, floor=1.0, min_samples=200)
    timings = learned_timings(configured, histories, adaptive, "default")
    assert timings.budget("load").max_no_progress == 1.0
    assert 30 <= timings.budget("call_ai").max_no_progress <= 36
    assert timings.budget("parse").max_no_progress == 5
    assert timings.budget("call_ai").deadline == 600


async def test_runner_records_stage_and_stream_durations(store: LeaseStore) -> None:
    """A run adds every stage's duration and the stream's first-token and gap to history."""
    runner = Runner(store, provider=ScriptedProvider(["a", "b", "c"]))
    await runner.run(Job("k", input="x"))
    await runner.flush_history()
    loaded = await store.load_durations()  # type: ignore[attr-defined]
    kinds = {(kind, stage) for (_, kind, stage) in loaded}
    assert {("stage", s) for s in ("load", "build_prompt", "call_ai", "parse", "persist")} <= kinds
    assert {("first_token", "call_ai"), ("gap", "call_ai")} <= kinds


async def test_recorder_keeps_counts_when_the_store_fails() -> None:
    """A failed flush keeps the pending counts for the next one."""

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0
            self.saved: list[object] = []

        async def add_durations(self, counts: object) -> None:
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("down")
            self.saved.append(counts)

        async def load_durations(self) -> dict[object, object]:
            return {}

    sink = Flaky()
    recorder = HistoryRecorder(sink)  # type: ignore[arg-type]
    recorder(Event("stage_done", "k", stage="load", value=0.5))
    with pytest.raises(ConnectionError):
        await recorder.flush()
    await recorder.flush()
    assert len(sink.saved) == 1


async def test_thread_stage_finishing_after_its_stall_is_a_false_takeover(
    store: LeaseStore,
) -> None:
    """A sync stage given up for no progress that finishes after all emits false_takeover."""
    release = threading.Event()
    events: list[Event] = []

    def slow_stage(ctx: StageContext) -> str:
        release.wait(10)
        return "late"

    timings = LeaseTimings(
        ttl=2.0,
        renew_interval=0.2,
        op_timeout=0.15,
        poll_interval=0.05,
        self_fence_margin=0.3,
        stage_budgets={"work": StageBudget(0.4, 30)},
    )
    runner = Runner(
        store,
        pipeline=Pipeline([Stage("work", slow_stage)]),
        config=RunConfig(timings=timings),
        hooks=RunHooks(on_event=events.append),
    )
    task = asyncio.create_task(runner.run(Job("k")))
    for _ in range(100):
        if any(e.kind == "stalled" for e in events):
            break
        await asyncio.sleep(0.05)  # real: the stage is a real thread, stuck and then released
    release.set()  # the "stuck" thread finishes after all: it was slow, not stuck
    for _ in range(100):
        if any(e.kind == "false_takeover" for e in events):
            break
        await asyncio.sleep(0.02)
    late = [e for e in events if e.kind == "false_takeover"]
    assert len(late) == 1 and late[0].stage == "work" and (late[0].value or 0) > 0
    assert "slow_not_stuck" in late[0].detail
    record = await asyncio.wait_for(task, 30)  # a later attempt finishes the job
    assert record.status.value == "DONE" and record.attempts == 2


def test_tune_prints_suggestions_from_a_test_run(tmp_path: Path) -> None:
    """`ai-lease tune` after a few real jobs: one row per stage, suggestions written out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ai_lease", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    for i in range(3):
        (tmp_path / "job.toml").write_text(f'key = "t{i}"\ninput = "One. Two. Three. Four."\n')
        assert cli("submit", "job.toml", "-q").returncode == 0
    out = cli("tune", "--min-samples", "3", "--write", "tuned.toml")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    stages = {row[2] for row in rows if row[1] == "stage"}
    assert stages == {"load", "build_prompt", "call_ai", "parse", "persist"}
    assert all(row[3] == "3" for row in rows)
    tuned = (tmp_path / "tuned.toml").read_text()
    assert "[stages.call_ai]" in tuned and "max_no_progress" in tuned
    check = cli("--config", "tuned.toml", "config")
    assert check.returncode == 0, check.stderr
    assert Counter(tuned.split())["max_no_progress"] == 5


@pytest.mark.parametrize(
    ("series", "buckets", "why"),
    [
        ("not-a-series", [], "not [pipeline, kind, stage]"),
        (["default", "stage"], [], "not [pipeline, kind, stage]"),
        (["default", "stage", 7], [], "not [pipeline, kind, stage]"),
        (["default", "stage", "load"], [("x", 1)], "bucket 'x'"),
        (["default", "stage", "load"], [(88, 1)], "bucket '88'"),
        (["default", "stage", "load"], [(3, "y")], "count 'y'"),
        (["default", "stage", "load"], [(3, -1)], "count '-1'"),
        (["default", "stage", "load"], [(3, 2**70)], "is not a count"),
    ],
)
def test_checked_histogram_refuses_what_add_durations_never_writes(
    series: object, buckets: list[tuple[object, object]], why: str
) -> None:
    """A stored series that is not ours is a CorruptRecord naming it, never a crash later."""
    from ai_lease.errors import CorruptRecord
    from ai_lease.lease.histogram import checked_histogram

    with pytest.raises(CorruptRecord) as caught:
        checked_histogram("the-name", series, buckets)
    assert "duration histogram 'the-name'" in str(caught.value) and why in str(caught.value)


def test_checked_histogram_reads_both_stores_shapes() -> None:
    """Redis's string buckets and counts and SQLite's integers read the same."""
    from ai_lease.lease.histogram import checked_histogram

    assert checked_histogram("n", ["p", "stage", "load"], [("3", "7"), (4, 1)]) == (
        ("p", "stage", "load"),
        {3: 7, 4: 1},
    )


async def test_load_durations_raises_or_reports_a_corrupt_series(tmp_path: Path) -> None:
    """Without on_corrupt a bad series raises CorruptRecord; with it, the rest loads."""
    import sqlite3

    from ai_lease.errors import CorruptRecord
    from ai_lease.stores.sqlite.store import SQLiteStore

    store = SQLiteStore(tmp_path / "h.db")
    try:
        await store.add_durations({("default", "stage", "load"): {3: 5}})
        with sqlite3.connect(tmp_path / "h.db") as conn:
            conn.execute("INSERT INTO ai_lease_durations VALUES ('d', 'stage', 'x', 'b', 1)")
        with pytest.raises(CorruptRecord):
            await store.load_durations()
        seen: list[CorruptRecord] = []
        loaded = await store.load_durations(on_corrupt=seen.append)
        assert loaded == {("default", "stage", "load"): {3: 5}}
        assert [exc.key for exc in seen] == ["d/stage/x"]
    finally:
        await store.aclose()
