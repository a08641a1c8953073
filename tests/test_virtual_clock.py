"""ai_lease.testing.VirtualClock: the one hand-moved clock the tests inject."""

from __future__ import annotations

import math

import pytest

from ai_lease.lease.progress import Progress
from ai_lease.testing.clock import VirtualClock


def test_stands_still_until_advanced() -> None:
    clock = VirtualClock(100.0)
    assert clock() == clock() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock() == 102.5


@pytest.mark.parametrize("step", [-0.001, math.nan, math.inf])
def test_never_runs_backwards_or_off_the_line(step: float) -> None:
    clock = VirtualClock(5.0)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(step)
    assert clock() == 5.0


def test_a_start_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        VirtualClock(math.inf)


def test_drives_code_that_takes_a_clock() -> None:
    """Injected into Progress, 21 s pass in no time and the idle figure says so."""
    clock = VirtualClock(10.0)
    progress = Progress(clock)
    progress.progress("chunk-1")
    clock.advance(21)
    assert clock() - progress.last_at == pytest.approx(21)
