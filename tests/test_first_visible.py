"""A reasoning model's two first times: the first progress and the first answer text.

The stream guard's first-token budget counts any progress (reasoning too); the record, the
events and the duration history keep the first *visible* text's time apart, so ``ai-lease
tune`` shows both.
"""

from __future__ import annotations

import pytest

from ai_lease import Job, LeaseStore, LeaseTimings, Runner
from ai_lease.lease.events import Event
from ai_lease.observe.history import HistoryRecorder
from ai_lease.observe.tuning import render_table
from ai_lease.providers.base import Delta
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.settings import Settings
from ai_lease.testing.scripted import Pause, ScriptedProvider
from ai_lease.timeouts import StageBudget, StreamTimeouts

TIMINGS = LeaseTimings(
    ttl=2.0,
    renew_interval=0.3,
    op_timeout=0.25,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(5, 30)},
)
THINKING = [
    Delta(reasoning="Let me think."),
    Pause(0.3),
    Delta(reasoning=" Still thinking."),
    Pause(0.3),
    "The answer.",
]


async def test_record_and_events_keep_the_first_visible_text_apart(store: LeaseStore) -> None:
    """Reasoning first, text 0.6 s later: first_token_s is the reasoning's, first_visible_s
    the text's, in the record (both stores) and as events."""
    events: list[Event] = []
    config = RunConfig(
        timings=TIMINGS,
        node_id="n1",
        stream_timeouts=StreamTimeouts(first_token=0.5, idle=0.5, total=10),
    )
    runner = Runner(
        store,
        provider=ScriptedProvider(THINKING),
        config=config,
        hooks=RunHooks(on_event=events.append),
    )
    done = await runner.run(Job("thinker", input="x"))
    assert done.output == "The answer."
    assert done.first_token_s is not None and done.first_visible_s is not None
    assert done.first_token_s < 0.3 <= 0.55 <= done.first_visible_s, done
    said = {e.kind: e.value for e in events if e.kind in ("first_token", "first_visible")}
    assert said["first_token"] == pytest.approx(done.first_token_s, abs=1e-5)  # µs stored
    assert said["first_visible"] == pytest.approx(done.first_visible_s, abs=1e-5)


async def test_tune_shows_first_visible_beside_first_token(store: LeaseStore) -> None:
    """The duration history records first_visible; the tune table shows it with a note."""

    class Memory:
        def __init__(self) -> None:
            self.added: dict[tuple[str, str, str], dict[int, int]] = {}

        async def add_durations(self, pending: dict[tuple[str, str, str], object]) -> None:
            for series, counts in pending.items():
                self.added[series] = dict(counts)  # type: ignore[call-overload]

    memory = Memory()
    recorder = HistoryRecorder(memory)  # type: ignore[arg-type]
    runner = Runner(
        store,
        provider=ScriptedProvider(THINKING),
        config=RunConfig(timings=TIMINGS, node_id="n1"),
        hooks=RunHooks(on_event=recorder),
    )
    await runner.run(Job("thinker-2", input="x"))
    await recorder.flush()
    kinds = {kind for _, kind, _ in memory.added}
    assert {"first_token", "first_visible"} <= kinds, kinds
    from ai_lease.observe.history import suggest

    table = render_table(suggest(memory.added, min_samples=1), Settings())
    row = next(line for line in table.splitlines() if "first_visible" in line)
    assert "no budget of its own" in row
