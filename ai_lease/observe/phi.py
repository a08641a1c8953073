"""φ-accrual suspicion (Hayashibara et al., 2004) over the gaps between arrivals.

Instead of a yes/no timeout, the detector says how *surprising* the current silence is,
given the gaps it has seen. It fits a normal distribution to the last ``window`` gaps
(mean ``μ``, standard deviation ``σ``) and, ``t`` seconds after the last arrival, reports

    φ(t) = -log10 P(gap ≥ t) = -log10(½ · erfc((t - μ) / (σ' · √2)))

with ``σ' = max(σ, min_std_s, 0.1 · μ)``: a perfectly regular series (σ = 0) would
otherwise make φ jump from 0 to infinity the instant a gap runs a hair long. φ = 8 means
"a gap this long happens once in 10⁸"; φ is 0 before any gap is known (one arrival or
none), grows without a jump as the silence lengthens, and is capped at :data:`PHI_MAX`
(past ``erfc``'s underflow it is computed from the tail's asymptote).

The time at which φ reaches a threshold has a closed form, ``μ + z(φ) · σ'``, where
``z(φ)`` depends on the threshold only (``z(8) ≈ 5.61``): :func:`crossing_s`. A watchdog
can therefore sleep until that moment instead of evaluating φ over and over.

>>> detector = PhiAccrual(clock=lambda: 0.0)
>>> for at in (0.0, 1.0, 2.0, 3.0):
...     detector.heartbeat(at)
>>> round(detector.phi(4.0), 2), round(detector.phi(4.5), 2), round(detector.suspect_at(8), 2)
(0.3, 6.54, 4.56)
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ai_lease.job import Health, JobState
    from ai_lease.lease.timeline import TimelineEntry

__all__ = [
    "DEFAULT_MIN_STD_S",
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW",
    "PHI_MAX",
    "OwnerPhi",
    "PhiAccrual",
    "crossing_s",
    "is_suspect",
    "normal_fit",
    "owner_phi",
    "phi_text",
    "phi_value",
    "renewal_phi",
]

DEFAULT_WINDOW = 100
"""How many of the latest gaps the fit uses."""
DEFAULT_MIN_STD_S = 0.1
"""The least standard deviation (seconds) the fit assumes."""
REL_MIN_STD = 0.1
"""...and at least this fraction of the mean gap."""
DEFAULT_THRESHOLD = 8.0
"""φ at which a job's owner is suspect (``lease.phi_threshold``, 6-10)."""
PHI_MAX = 1e3
"""φ never reads more than this (a gap 10¹⁰⁰⁰ times rarer than its peers is simply lost)."""
_SQRT2 = math.sqrt(2.0)
_LN10 = math.log(10.0)
_ERFC_ASYMPTOTE = 20.0  # past this, erfc(x) ≈ e^(-x²) / (x√π) to better than 0.2 %


def phi_value(elapsed: float, mean: float, std: float) -> float:
    """φ of a silence of ``elapsed`` seconds under a normal fit (``std`` already floored)."""
    if std <= 0:
        raise ValueError(f"phi_value: std must be positive (got {std!r}): floor it first")
    x = (elapsed - mean) / (std * _SQRT2)
    if x < _ERFC_ASYMPTOTE:
        tail = 0.5 * math.erfc(x)
        return min(PHI_MAX, max(0.0, -math.log10(tail))) if tail > 0 else PHI_MAX
    # -log10(½ e^(-x²) / (x√π)) = (x² + ln(x√π) + ln 2) / ln 10
    value = (x * x + math.log(x * math.sqrt(math.pi)) + math.log(2.0)) / _LN10
    return min(PHI_MAX, value)


@lru_cache(maxsize=64)
def _z(threshold: float) -> float:
    """The x with φ = ``threshold`` for a silence of ``mean + x·√2·std`` (bisection)."""
    lo, hi = -10.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if phi_value(mid * _SQRT2, 0.0, 1.0) < threshold:
            lo = mid
        else:
            hi = mid
    return hi


def crossing_s(threshold: float, mean: float, std: float) -> float:
    """The silence (seconds after the last arrival) at which φ reaches ``threshold``."""
    if not 0 < threshold < PHI_MAX:
        raise ValueError(f"crossing_s: threshold must be in (0, {PHI_MAX:g}) (got {threshold!r})")
    return mean + _z(threshold) * _SQRT2 * std


def floored_std(std: float, mean: float, min_std_s: float) -> float:
    """The standard deviation the fit assumes: ``max(std, min_std_s, 0.1 · mean)``."""
    return max(std, min_std_s, REL_MIN_STD * mean)


def normal_fit(gaps: Iterable[float], min_std_s: float = DEFAULT_MIN_STD_S) -> tuple[float, float]:
    """``(mean, floored std)`` of ``gaps`` in one pass (at least one gap)."""
    n, total, squares = 0, 0.0, 0.0
    for gap in gaps:
        n, total, squares = n + 1, total + gap, squares + gap * gap
    if n == 0:
        raise ValueError("normal_fit: no gaps to fit")
    mean = total / n
    variance = max(0.0, squares / n - mean * mean)
    return mean, floored_std(math.sqrt(variance), mean, min_std_s)


class PhiAccrual:
    """A φ-accrual detector over arrivals; O(1) per arrival (running sums over a deque).

    ``heartbeat(at)`` records an arrival (``at`` defaults to ``clock()``); ``phi(now)`` is
    the suspicion ``now - last`` seconds after the latest one. Arrivals out of order (or
    at the same instant) add a gap of 0, which the std floor keeps harmless.
    """

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW,
        min_std_s: float = DEFAULT_MIN_STD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window < 1:
            raise ValueError(f"PhiAccrual.window: must be at least 1 (got {window!r})")
        if not min_std_s > 0:
            raise ValueError(f"PhiAccrual.min_std_s: must be positive seconds (got {min_std_s!r})")
        self.window, self.min_std_s, self.clock = window, min_std_s, clock
        self.gaps: deque[float] = deque()
        self.last: float | None = None
        self._total = self._squares = 0.0
        self._evicted = 0  # since the sums were last recomputed: bounds float drift

    def heartbeat(self, at: float | None = None) -> None:
        """Record an arrival at ``at`` (default: now)."""
        at = self.clock() if at is None else at
        if self.last is not None:
            self._add(max(0.0, at - self.last))
        self.last = at if self.last is None else max(self.last, at)

    def _add(self, gap: float) -> None:
        gaps = self.gaps
        if len(gaps) == self.window:
            old = gaps.popleft()
            self._total -= old
            self._squares -= old * old
            self._evicted += 1
        gaps.append(gap)
        self._total += gap
        self._squares += gap * gap
        if self._evicted >= self.window:  # amortised O(1): exact sums once per window
            self._total, self._squares = sum(gaps), sum(g * g for g in gaps)
            self._evicted = 0

    @property
    def mean(self) -> float:
        """The mean gap of the window (0 before any gap)."""
        return self._total / len(self.gaps) if self.gaps else 0.0

    @property
    def std(self) -> float:
        """The floored standard deviation the fit uses."""
        mean = self.mean
        raw = max(0.0, self._squares / len(self.gaps) - mean * mean) if self.gaps else 0.0
        return floored_std(math.sqrt(raw), mean, self.min_std_s)

    def phi(self, now: float | None = None) -> float:
        """φ at ``now`` (default: the clock); 0 with fewer than two arrivals."""
        if self.last is None or not self.gaps:
            return 0.0
        now = self.clock() if now is None else now
        return phi_value(now - self.last, self.mean, self.std)

    def suspect_at(self, threshold: float) -> float:
        """When φ reaches ``threshold`` if nothing arrives (inf with fewer than two arrivals)."""
        if self.last is None or not self.gaps:
            return math.inf
        return self.last + crossing_s(threshold, self.mean, self.std)


# -- a job's owner, from the renewals the store saw ------------------------------------------------

_BEATS = frozenset({"acquired", "taken_over", "renewed"})  # the lease's start, then each renewal


@dataclass(frozen=True, slots=True)
class OwnerPhi:
    """φ of a RUNNING job's owner, read once from its renewals, and how every view shows it:
    ``status`` (text, ``--json``, ``--watch``) and the dashboard print these same fields.

    ``value`` is rounded to 0.1, as printed; None when it is **unknown**: fewer than two
    heartbeats (the lease's start and one renewal) give no gap to measure, and a silence
    with nothing to compare it to is no evidence either way (never φ 0).

    >>> OwnerPhi(None).text, OwnerPhi(9.14).text
    ('φ unknown (fewer than 2 heartbeats; suspect at 8)', 'φ 9.1: suspect (threshold 8)')
    """

    value: float | None
    threshold: float = DEFAULT_THRESHOLD

    @property
    def text(self) -> str:
        """The suspicion row: ``φ 3.2 (suspect at 8)``, ``φ 9.1: suspect (threshold 8)``."""
        return phi_text(self.value, self.threshold)

    @property
    def reached(self) -> bool:
        """φ is known and at or past the threshold."""
        return self.value is not None and self.value >= self.threshold


def owner_phi(
    entries: Sequence[TimelineEntry],
    job: JobState,
    threshold: float = DEFAULT_THRESHOLD,
    now: float | None = None,
) -> OwnerPhi | None:
    """φ of ``job``'s current owner: over the gaps between its renewals in the job's
    timeline (the store's clock), ``now`` (default: the record's ``read_at``) seconds in.
    None unless the job is RUNNING with an owner; ``value`` None (unknown) with fewer than
    two heartbeats seen. The one place φ of an owner is computed."""
    from ai_lease.job import Status

    if job.status is not Status.RUNNING or not job.owner_id:
        return None
    detector = PhiAccrual()
    for entry in entries:
        if entry.kind in _BEATS and entry.owner_id == job.owner_id and entry.token == job.token:
            detector.heartbeat(entry.at)
    if not detector.gaps:
        return OwnerPhi(None, threshold)
    return OwnerPhi(round(detector.phi(job.read_at if now is None else now), 1), threshold)


def renewal_phi(
    entries: Sequence[TimelineEntry], job: JobState, now: float | None = None
) -> float | None:
    """:func:`owner_phi`'s value alone (None: not RUNNING, or unknown)."""
    found = owner_phi(entries, job, now=now)
    return None if found is None else found.value


def phi_text(phi: float | None, threshold: float = DEFAULT_THRESHOLD) -> str:
    """How φ reads next to a job's health: ``φ 3.2 (suspect at 8)``, ``φ 9.1: suspect
    (threshold 8)``, or (None) ``φ unknown (fewer than 2 heartbeats; suspect at 8)``."""
    if phi is None:
        return f"φ unknown (fewer than 2 heartbeats; suspect at {threshold:g})"
    if phi >= threshold:
        return f"φ {phi:.1f}: suspect (threshold {threshold:g})"
    return f"φ {phi:.1f} (suspect at {threshold:g})"


def is_suspect(
    phi: float | None, health: Health | None, threshold: float = DEFAULT_THRESHOLD
) -> bool:
    """φ has reached ``threshold`` while the heartbeat's own rule (``JobState.health``:
    renew interval plus grace, or the TTL) does not yet say the node is lost."""
    from ai_lease.job import Health

    alive = health in (Health.HEALTHY, Health.ZOMBIE)
    return phi is not None and phi >= threshold and alive
