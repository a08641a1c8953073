"""``cpu_idle_pct``, read back from a stored stall snapshot, for ``status`` and the dashboard.

A process-isolated job's snapshot (:class:`~ai_lease.run.isolation.evidence.ChildSnapshot`,
rendered into ``JobState.stall_snapshot``) ends with its resource figures, one
``name: value`` line each; ``cpu_idle_pct`` is the share of the wall time since the job's
last progress that its child did *not* spend on a CPU. The seed's rule of thumb — CPU under
5 % and no progress — is evidence of a stuck wait (a lock, a socket, a sleep) rather than
slow work; a low figure is a child busy computing (slow work, or a busy loop). A snapshot
of task isolation (the keeper's, of one coroutine) has no figures: nothing is shown.
"""

from __future__ import annotations

import re

__all__ = ["STUCK_WAIT_PCT", "cpu_idle_of", "cpu_idle_text"]

STUCK_WAIT_PCT = 95.0
"""At or above this ``cpu_idle_pct`` the child was waiting, not working (the seed's CPU < 5 %)."""

_LINE = re.compile(r"^cpu_idle_pct: (\S+)$", re.MULTILINE)


def cpu_idle_of(snapshot: str | None) -> float | str | None:
    """The snapshot's ``cpu_idle_pct``: a number, ``"unavailable"`` (the child's figures
    could not be read), or None (a snapshot without figures, or none)."""
    found = _LINE.findall(snapshot or "")
    if not found:
        return None
    try:
        return float(found[-1])  # the figures come last, after any stack text
    except ValueError:
        return "unavailable"


def cpu_idle_text(value: float | str) -> str:
    """For people: the figure and what it suggests.

    >>> cpu_idle_text(99.2)
    '99.2 % idle since the last progress: a stuck wait, not slow work'
    """
    if isinstance(value, str):
        return value
    if value >= STUCK_WAIT_PCT:
        return f"{value:.1f} % idle since the last progress: a stuck wait, not slow work"
    return f"{value:.1f} % idle since the last progress: busy (slow work, or a busy loop)"
