"""The CLI's live view: what it keeps of a streamed answer is bounded, so a long answer
costs linear time and constant memory, and what it shows is the answer's true tail."""

from __future__ import annotations

import io
import time
import tracemalloc

from rich.console import Console

from ai_lease.cli.console import TAIL_CHARS, JobView
from ai_lease.errors import JobFailed
from ai_lease.job import JobState, Status
from ai_lease.lease.events import Event
from ai_lease.testing.clock import VirtualClock
from ai_lease.timeouts import StreamTimeouts


def test_view_keeps_the_true_tail_of_a_long_stream() -> None:
    """After many chunks the view holds exactly the last TAIL_CHARS characters."""
    view = JobView("k", live=False, out=io.StringIO())
    chunks = [f"<{i:06d}>" for i in range(20_000)]
    for chunk in chunks:
        view.on_text(chunk)
    assert view.text == "".join(chunks)[-TAIL_CHARS:]
    assert view.chunks == len(chunks)


def test_view_memory_stays_bounded_however_long_the_answer() -> None:
    """20 MB streamed in 1 KB chunks (and one 5 MB chunk) never holds more than a few KB:
    a view that accumulates the text (`+=` per chunk, quadratic copying) holds it all."""
    view = JobView("k", live=False, out=io.StringIO())
    chunk = "x" * 1024
    tracemalloc.start()
    try:
        for _ in range(20_000):
            view.on_text(chunk)
        view.on_text("y" * 5_000_000)
        _, peak = tracemalloc.get_traced_memory()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(view.text) == TAIL_CHARS and view.text == "y" * TAIL_CHARS
    assert held < 1_000_000, held
    assert peak < 12_000_000, peak  # the 5 MB chunk itself, not 25 MB of accumulated text


def test_a_new_stream_starts_an_empty_tail() -> None:
    """reset_text (a new streamed attempt) empties what is shown."""
    view = JobView("k", live=False, out=io.StringIO())
    view.on_text("old answer")
    view.reset_text()
    view.on_text("new")
    assert view.text == "new"


# -- the live panel, on an injected clock and a terminal console writing to a StringIO --------


def live_view(clock: VirtualClock, *, auto_refresh: bool = False) -> tuple[JobView, io.StringIO]:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)
    view = JobView(
        "k",
        live=True,
        stream=StreamTimeouts(first_token=20, idle=7, total=300),
        clock=clock,
        console=console,
        auto_refresh=auto_refresh,
    )
    return view, screen


def last_frame(screen: io.StringIO) -> str:
    """What the terminal shows now: rich erases the previous frame's lines before each
    redraw, so the text after the last erase is the frame on screen."""
    return screen.getvalue().split("\x1b[2K")[-1]


def stage_event(stage: str, budget: float) -> Event:
    return Event("stage", "k", "node-a#1", 7, stage, detail=f"max_no_progress {budget:g}s")


def test_since_progress_grows_between_redraws_without_events() -> None:
    """A stall shows as a growing idle counter: each redraw reads the clock, and no event
    (or chunk) is needed for it to move; the stage budget's time left shrinks with it."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock)
    with view:
        view.on_event(stage_event("load", 5))
        first = last_frame(screen)
        clock.now += 3.5
        view.refresh()
        second = last_frame(screen)
        clock.now += 4.0
        view.refresh()
        third = last_frame(screen)
    assert "since progress  0.0 s" in first and "stage load 5 s · 5.0 s left" in first
    assert "since progress  3.5 s" in second and "1.5 s left" in second
    assert "since progress  7.5 s" in third and "over by 2.5 s" in third


def test_the_timer_redraws_the_panel_by_itself() -> None:
    """With rich's refresh thread on, the idle counter moves on screen while nothing calls
    the view at all (a panel redrawn only on events would freeze during a stall)."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock, auto_refresh=True)
    with view:
        view.on_event(stage_event("call_ai", 90))
        clock.now += 42.0
        deadline = time.monotonic() + 5
        while "since progress  42.0 s" not in screen.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)  # real: rich's refresh thread redraws on its own timer
    assert "since progress  42.0 s" in screen.getvalue()


def test_budget_shown_is_first_token_then_idle() -> None:
    """While a stream waits for its first content the first-token budget applies (counted
    from the stream's start); from the first content on, the idle budget (from the last)."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock)
    with view:
        view.on_event(stage_event("call_ai", 90))
        view.stream_opened()
        clock.now += 2.0
        view.refresh()
        waiting = last_frame(screen)
        view.on_text("Hello")
        clock.now += 3.0
        view.refresh()
        streaming = last_frame(screen)
        view.stream_closed()
        view.refresh()
        after = last_frame(screen)
    assert "first_token 20 s · 18.0 s left" in waiting and "idle" not in waiting
    assert "idle 7 s · 4.0 s left" in streaming and "first_token" not in streaming
    assert "stage call_ai 90 s · 87.0 s left" in after


def done_record(token: int = 1796128723140076) -> JobState:
    return JobState(
        "k", Status.DONE, owner_id="node-a#1", token=token, attempts=1, result='"the answer"'
    )


def test_final_line_and_the_answer_is_not_left_on_screen() -> None:
    """The last frame ends with the summary line (time, chunks, tokens, lease token,
    attempt) instead of the streamed text: the answer is printed once, after the panel."""
    clock = VirtualClock(100.0)
    view, screen = live_view(clock)
    answer = "UNIQUE-ANSWER-TEXT"
    with view:
        view.on_event(Event("acquired", "k", "node-a#1", 1796128723140076, detail="attempt 1"))
        view.on_event(stage_event("call_ai", 90))
        view.stream_opened()
        view.on_text(answer)
        view.refresh()
        assert answer in last_frame(screen)  # shown while it streams
        attrs = {"chunks": 66, "prompt_tokens": 184, "completion_tokens": 66}
        view.on_event(Event("model_call", "k", "node-a#1", 1796128723140076, attrs=attrs))
        clock.now += 1.4
        view.finish(done_record())
    final = last_frame(screen)
    assert "DONE in 1.4 s · 66 chunks · 184/66 tokens · token 1796… · attempt 1" in final
    assert answer not in final


def test_a_failed_run_ends_with_a_failure_line() -> None:
    """A run that raises ends the panel (or the log) with what ended it and the attempt."""
    clock = VirtualClock(100.0)
    out = io.StringIO()
    view = JobView("k", live=False, out=out, clock=clock)
    try:
        with view:
            view.on_event(Event("acquired", "k", "node-a#1", 9, detail="attempt 2"))
            clock.now += 3.25
            raise JobFailed("k", "StreamIdleTimeout: no content for 30s")
    except JobFailed:
        pass
    assert out.getvalue().splitlines()[-1] == "ai-lease: TIMED OUT in 3.2 s · token 9 · attempt 2"


def test_plain_lines_keep_the_figures_events_carry() -> None:
    """Off a terminal, first-token time, chunks and tokens are in the event lines."""
    out = io.StringIO()
    view = JobView("k", live=False, out=out)
    view.on_event(Event("first_token", "k", "o", 1, "call_ai", detail="local", value=0.25))
    attrs = {"chunks": 39, "prompt_tokens": 184, "completion_tokens": 39, "finish_reason": "stop"}
    view.on_event(Event("model_call", "k", "o", 1, "call_ai", detail="local", attrs=attrs))
    first, call = out.getvalue().splitlines()
    assert first.endswith("[call_ai] local after 0.250 s")
    assert call.endswith("local · 39 chunks · 184/39 tokens · finish stop")
