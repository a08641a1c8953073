"""φ-accrual suspicion: the detector's math under an injected clock."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ai_lease.observe.phi import (
    PHI_MAX,
    PhiAccrual,
    crossing_s,
    normal_fit,
    phi_value,
)
from ai_lease.testing.clock import VirtualClock

# The one-sided normal tail with P = 1e-8 lies 5.6120 standard deviations out (tables).
Z8 = 5.6120


def fed(gaps: list[float], **kwargs: float) -> tuple[PhiAccrual, VirtualClock]:
    """A detector that saw arrivals separated by ``gaps`` (the clock at the last one)."""
    clock = VirtualClock()
    detector = PhiAccrual(clock=clock, **kwargs)  # type: ignore[arg-type]
    detector.heartbeat()
    for gap in gaps:
        clock.now += gap
        detector.heartbeat()
    return detector, clock


def test_regular_series_uses_the_floored_std() -> None:
    """A perfectly regular series: σ' = max(0, 0.1 s, 0.1·μ), φ = 0.30 at the mean gap."""
    detector, clock = fed([1.0] * 50)
    assert detector.mean == pytest.approx(1.0)
    assert detector.std == pytest.approx(0.1)
    assert detector.phi(clock.now + 1.0) == pytest.approx(math.log10(2))
    assert detector.suspect_at(8) - clock.now == pytest.approx(1.0 + Z8 * 0.1, abs=1e-3)
    steps = [detector.phi(clock.now + k * 0.01) for k in range(300)]
    assert steps == sorted(steps)  # φ only grows with the silence


def test_jittery_series_fits_mean_and_std() -> None:
    """Jittered gaps: the fit is the window's mean and population std; φ crosses later."""
    rng = random.Random(7)
    gaps = [rng.uniform(0.5, 1.5) for _ in range(100)]
    detector, clock = fed(gaps)
    assert detector.mean == pytest.approx(statistics.fmean(gaps))
    assert detector.std == pytest.approx(statistics.pstdev(gaps))
    crossing = detector.mean + Z8 * detector.std
    assert detector.phi(clock.now + 1.5) < 8  # the longest gap it has seen is not suspect
    assert detector.suspect_at(8) - clock.now == pytest.approx(crossing, abs=1e-3)
    assert detector.phi(clock.now + crossing + 0.1) > 8


def test_sudden_stop_crosses_8_at_the_computed_time() -> None:
    """A 50 ms stream that stops: φ reaches 8 at μ + z(8)·σ' (0.05 + 5.612 · 0.1 s)."""
    detector, clock = fed([0.05] * 100)
    expected = 0.05 + Z8 * 0.1
    crossed = detector.suspect_at(8) - clock.now
    assert crossed == pytest.approx(expected, abs=1e-3)  # Z8 is given to 4 digits
    assert detector.phi(clock.now + crossed) == pytest.approx(8.0, abs=1e-6)
    # Stepping the clock by 10 ms, the first step at φ ≥ 8 is the first past the crossing.
    step, silence = 0.01, 0.0
    while detector.phi(clock.now + silence) < 8:
        silence += step
    assert crossed <= silence < crossed + step + 1e-9


def test_slow_but_steady_series_never_crosses() -> None:
    """Paragraphs 20 s ± 2 s apart: φ, read just before each arrival, stays under 8."""
    rng = random.Random(3)
    clock = VirtualClock()
    detector = PhiAccrual(clock=clock)
    worst = 0.0
    for _ in range(300):
        detector.heartbeat()
        clock.now += rng.uniform(18.0, 22.0)
        worst = max(worst, detector.phi())
    assert worst < 8


def test_window_caps_the_fit() -> None:
    """Only the last ``window`` gaps count: 40 gaps of 1 s then 10 of 3 s fit μ = 3."""
    detector, _ = fed([1.0] * 40 + [3.0] * 10, window=10)
    assert len(detector.gaps) == 10
    assert detector.mean == pytest.approx(3.0)


def test_running_sums_do_not_drift() -> None:
    """After many evictions the running mean and std equal a fresh fit of the window."""
    rng = random.Random(11)
    detector, _ = fed([rng.uniform(0.001, 100.0) for _ in range(20_000)])
    mean, std = normal_fit(detector.gaps)
    assert detector.mean == pytest.approx(mean, rel=1e-9)
    assert detector.std == pytest.approx(std, rel=1e-6)


def test_one_arrival_or_none_is_never_suspect() -> None:
    """With no gap known φ is 0 however long the silence, and no crossing is due."""
    clock = VirtualClock()
    detector = PhiAccrual(clock=clock)
    assert detector.phi(1e9) == 0.0
    detector.heartbeat()
    clock.now = 1e9
    assert detector.phi() == 0.0
    assert detector.suspect_at(8) == math.inf


def test_zero_and_out_of_order_gaps_stay_finite() -> None:
    """Arrivals at one instant (or going back) add gaps of 0: φ stays finite and sane."""
    detector, clock = fed([0.0] * 20)
    detector.heartbeat(clock.now - 5.0)  # out of order: a gap of 0, the last stays put
    assert detector.last == clock.now
    assert detector.mean == 0.0 and detector.std == pytest.approx(0.1)
    assert detector.phi(clock.now) == pytest.approx(math.log10(2))
    assert 8 < detector.phi(clock.now + 1.0) < PHI_MAX


def test_huge_silence_is_capped_without_a_jump() -> None:
    """Past erfc's underflow φ follows the tail's asymptote, continuous, capped at PHI_MAX."""
    boundary = 20.0 * math.sqrt(2)  # x = 20, where the asymptote takes over
    below, above = phi_value(boundary - 1e-9, 0.0, 1.0), phi_value(boundary + 1e-9, 0.0, 1.0)
    assert above == pytest.approx(below, rel=1e-2)
    assert phi_value(1e6, 0.0, 1.0) == PHI_MAX
    assert phi_value(-1e6, 0.0, 1.0) == 0.0


def test_crossing_inverts_phi() -> None:
    """crossing_s is the inverse of φ for every threshold the settings allow (6-10)."""
    for threshold in (6.0, 7.5, 8.0, 10.0):
        assert phi_value(crossing_s(threshold, 2.0, 0.3), 2.0, 0.3) == pytest.approx(threshold)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [({"window": 0}, "window"), ({"min_std_s": 0.0}, "min_std_s")],
)
def test_bad_parameters_are_named(kwargs: dict[str, float], words: str) -> None:
    """A window under 1 or a std floor that is not positive is refused by name."""
    with pytest.raises(ValueError, match=words):
        PhiAccrual(**kwargs)  # type: ignore[arg-type]
