"""The live panel of `ai-lease submit` is honest between attempts and at its end: the
backoff shows as such (no owner, no stage), chunks are the attempt's own, the tightest
budget is the one shown, an interrupt says the job was left to workers, and a run that
never started says why (bad input: nothing stored; a job already failed: how to rerun)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ai_lease import Acquired, open_store
from ai_lease.cli.console import JobView
from ai_lease.cli.interrupt import Interrupted
from ai_lease.errors import InputError, JobFailed
from ai_lease.lease.events import Event
from ai_lease.testing.clock import VirtualClock
from ai_lease.timeouts import StreamTimeouts
from tests.test_cli_console import last_frame, live_view, stage_event


def acquired(attempt: int) -> Event:
    return Event("acquired", "k", f"node-a#{attempt}", 10 + attempt, detail=f"attempt {attempt}")


def test_the_backoff_between_attempts_shows_no_owner_and_counts_down() -> None:
    """After a failed attempt the panel shows no owner, no stage and no stage budget, but
    "retrying in N s (attempt k/3)" counting down; the next attempt's chunks start at 0."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock)
    view.attempts = 3
    with view:
        view.on_event(acquired(1))
        view.on_event(stage_event("call_ai", 90))
        view.stream_opened()
        for _ in range(5):
            view.on_text("x")
        view.stream_closed()
        fence = ("node-a#1", 11)
        view.on_event(Event("released", "k", *fence, detail="StreamIdleTimeout: no content"))
        view.on_event(Event("retry", "k", *fence, detail="StreamIdleTimeout: x; retrying in 2s"))
        clock.now += 0.5
        view.refresh()
        waiting = last_frame(screen)
        view.on_event(acquired(2))
        view.on_event(Event("stage", "k", "node-a#2", 12, "call_ai", detail="max_no_progress 90s"))
        view.stream_opened()
        view.on_text("y")
        view.on_text("y")
        view.refresh()
        second = last_frame(screen)
    shown = " ".join(waiting.split())
    assert "budget retrying in 1.5 s (attempt 2/3)" in shown, waiting
    assert "role retrying owner -" in shown and "stage - token -" in shown, waiting
    assert "role owner owner node-a#2" in " ".join(second.split()), second
    assert "chunks 2 " in " ".join(second.split()), second  # this attempt's, not 7


def test_the_tightest_budget_is_shown_total_included() -> None:
    """With chunks flowing, the idle budget would have plenty left, but the stream's total
    budget has less: that one is shown (and before the first chunk, whichever is less of
    first-token and total)."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock)
    view.stream = StreamTimeouts(first_token=20, idle=7, total=8)
    with view:
        view.on_event(stage_event("call_ai", 90))
        view.stream_opened()
        clock.now += 1
        view.refresh()
        start = last_frame(screen)
        for _ in range(5):
            clock.now += 1
            view.on_text("x")
        view.refresh()
        late = last_frame(screen)
    assert "total 8 s · 7.0 s left" in start, start
    assert "total 8 s · 2.0 s left" in late and "idle" not in late, late


def plain_end(raised: BaseException, *events: Event) -> str:
    out = io.StringIO()
    view = JobView("k", live=False, out=out, clock=VirtualClock(100.0))
    with pytest.raises(type(raised)), view:
        for event in events:
            view.on_event(event)
        raise raised
    return out.getvalue().splitlines()[-1]


def test_ctrl_c_without_cancel_ends_left_to_workers_not_failed() -> None:
    """An interrupt that handed the job to workers ends INTERRUPTED · left to workers;
    with --cancel-on-interrupt, INTERRUPTED · job cancelled; never FAILED."""
    left = Interrupted("SIGINT", "job 'k' left to workers (spec stored, due now)")
    line = plain_end(left, acquired(1))
    assert line.startswith("ai-lease: INTERRUPTED in ") and line.endswith("left to workers"), line
    cancelled = plain_end(Interrupted("SIGINT", "job 'k' cancelled"), acquired(1))
    assert cancelled.endswith("· job cancelled") and "FAILED" not in cancelled, cancelled


def test_a_run_that_never_started_says_why() -> None:
    """Bad input before any acquisition (a template error) ends NOT RUN, nothing stored;
    a key found already FAILED ends ALREADY … with the commands that run it again."""
    bad = plain_end(InputError("prompt 'p': unexpected end of template"))
    assert bad == "ai-lease: NOT RUN in 0.0 s · bad input: nothing stored", bad
    again = plain_end(JobFailed("k", "StreamIdleTimeout: no content for 30s"))
    assert again.startswith("ai-lease: ALREADY TIMED OUT in 0.0 s"), again
    assert "`ai-lease retry k` or `submit --force` runs it again" in again, again


def test_figures_are_formatted_not_raw_floats() -> None:
    """An event's value is shown rounded with its unit (first_visible after 0.004 s), never
    as a raw float like (0.00359622)."""
    out = io.StringIO()
    view = JobView("k", live=False, out=out)
    view.on_event(Event("first_visible", "k", "o", 1, "call_ai", detail="local", value=0.00359622))
    view.on_event(Event("stalled", "k", "o", 1, "call_ai", detail="stuck", value=12.345678))
    first, other = out.getvalue().splitlines()
    assert first.endswith("local after 0.004 s"), first
    assert other.endswith("stuck (12.346)") and "0.00359622" not in out.getvalue(), other


# -- through the real entry point ------------------------------------------------------------


def submit(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", "submit", "job.toml", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_template_error_ends_not_run_and_stores_nothing(tmp_path: Path) -> None:
    """submit with a broken template: exit 2, the summary says NOT RUN (nothing stored),
    and no job was recorded."""
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "broken.j2").write_text("{% if %}")
    (tmp_path / "job.toml").write_text('key = "t"\nprompt = "broken"\ninput = "x"\n')
    out = submit(tmp_path)
    assert out.returncode == 2, out.stderr
    assert "ai-lease: NOT RUN in " in out.stderr and "FAILED" not in out.stderr, out.stderr
    db = tmp_path / ".ai-lease" / "ai-lease.db"
    if db.exists():
        assert asyncio.run(_get(f"sqlite:///{db}", "t")) is None


async def _get(url: str, key: str) -> object:
    store = open_store(url)
    try:
        return await store.get(key)
    finally:
        await store.aclose()


def test_resubmitting_a_failed_key_gives_the_rerun_hint(tmp_path: Path) -> None:
    """submit of a key already FAILED (by a timeout): exit 3, and the summary names
    `ai-lease retry KEY` and `submit --force`."""
    url = f"sqlite:///{tmp_path}/.ai-lease/ai-lease.db"

    async def failed() -> None:
        store = open_store(url)
        won = await store.acquire("t", "node-a", ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        await store.fail(won.fence, "StreamIdleTimeout: no content for 30s")
        await store.aclose()

    asyncio.run(failed())
    (tmp_path / "job.toml").write_text('key = "t"\ninput = "One. Two. Three."\n')
    out = submit(tmp_path)
    assert out.returncode == 3, out.stderr
    assert "ALREADY TIMED OUT" in out.stderr, out.stderr
    assert "`ai-lease retry t` or `submit --force` runs it again" in out.stderr, out.stderr
