"""The local progress tracker: what counts as progress, its version and idle time."""

from __future__ import annotations

from ai_lease.lease.progress import Progress
from ai_lease.testing.clock import VirtualClock
from ai_lease.timeouts import StageBudget


def test_same_marker_repeated_is_not_progress() -> None:
    """Calling progress() again with the last marker records nothing."""
    clock = VirtualClock(100.0)
    p = Progress(clock)
    assert p.progress("batch-1") is True
    version, last_at = p.version, p.last_at
    clock.advance(5)
    assert p.progress("batch-1") is False
    assert p.progress("batch-1") is False
    assert (p.version, p.last_at) == (version, last_at)
    assert p.idle() == 5


def test_new_marker_is_progress() -> None:
    """A marker different from the last one counts and moves last_at."""
    clock = VirtualClock(100.0)
    p = Progress(clock)
    p.progress("batch-1")
    clock.advance(3)
    assert p.progress("batch-2") is True
    assert p.version == 2
    assert p.last_at == clock.now
    assert p.idle() == 0


def test_a_marker_seen_before_but_not_last_counts_again() -> None:
    """Only the immediately preceding marker is deduplicated (A, B, A is three steps)."""
    p = Progress(VirtualClock(100.0))
    assert [p.progress(m) for m in ("a", "b", "a")] == [True, True, True]
    assert p.version == 3


def test_none_marker_always_counts() -> None:
    """Without a marker every call is progress."""
    clock = VirtualClock(100.0)
    p = Progress(clock)
    for _ in range(4):
        clock.advance(1)
        assert p.progress() is True
    assert p.version == 4
    assert p.last_at == clock.now


def test_entering_a_stage_is_progress() -> None:
    """enter() bumps the version, sets stage and budget, and resets the idle time."""
    clock = VirtualClock(100.0)
    p = Progress(clock)
    clock.advance(7)
    assert p.idle() == 7
    budget = StageBudget(5)
    p.enter("load", budget)
    assert (p.stage, p.budget, p.version) == ("load", budget, 1)
    assert p.idle() == 0


def test_entering_a_stage_resets_the_marker() -> None:
    """The marker of the previous stage does not suppress the same marker in the next stage."""
    p = Progress(VirtualClock(100.0))
    p.enter("load", StageBudget(5))
    assert p.progress(0) is True
    p.enter("parse", StageBudget(5))
    assert p.progress(0) is True
    assert p.progress(0) is False
    assert p.version == 4


def test_entering_the_same_stage_again_is_progress() -> None:
    """enter() always counts, even for the stage already running."""
    p = Progress(VirtualClock(100.0))
    p.enter("load", StageBudget(5))
    p.enter("load", StageBudget(5))
    assert p.version == 2


def test_version_starts_at_zero_and_idle_counts_from_creation() -> None:
    """A fresh tracker has version 0, no stage, and idles from its creation time."""
    clock = VirtualClock(50.0)
    p = Progress(clock)
    assert (p.version, p.stage, p.thread_ident) == (0, None, None)
    clock.advance(2.5)
    assert p.idle() == 2.5


def test_idle_accepts_an_explicit_now() -> None:
    """idle(now) measures against the given time instead of reading the clock."""
    clock = VirtualClock(10.0)
    p = Progress(clock)
    p.progress()
    assert p.idle(now=14.0) == 4.0
    assert p.idle() == 0.0


def test_repr_names_stage_and_version() -> None:
    """The repr shows the stage, version and idle time."""
    clock = VirtualClock(100.0)
    p = Progress(clock)
    p.enter("call_ai", StageBudget(90))
    clock.advance(1.5)
    assert repr(p) == "<Progress stage='call_ai' version=1 idle=1.50s>"
