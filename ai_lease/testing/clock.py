"""A clock that moves only when the test moves it.

Every part of ai_lease that reads the time takes it as a plain callable (``clock=`` on the
keeper's progress, the stream guard, φ, the outage log, the login throttle, the shared
reads, the console view, the SQLite file's expiry). Hand one of these instead of
``time.monotonic`` and a test decides what "30 seconds later" is, without waiting 30
seconds, on a loaded CI machine as on an idle one. trio's ``MockClock`` is the model: the
time stands still until :meth:`VirtualClock.advance` moves it, and it never runs backwards.

    clock = VirtualClock()
    progress = Progress(clock)
    clock.advance(21)          # past the no-progress budget, in no time
"""

from __future__ import annotations

import math

__all__ = ["VirtualClock"]


class VirtualClock:
    """Seconds as a float that change only through :meth:`advance` (or by setting ``now``).

    ``start`` is where it begins: 0 for a monotonic reading, an epoch value such as
    ``1_800_000_000.0`` where the code under test compares with wall-clock times.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise ValueError(f"a clock starts at a finite time, not {start!r}")
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward and return the new time; never backwards."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a clock moves forward by a finite amount, not {seconds!r}")
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now!r})"
