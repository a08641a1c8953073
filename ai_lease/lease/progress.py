"""The owner's local record of real progress: stage, progress version, last progress time.

Called once per streamed chunk, so it does no I/O and allocates nothing: a comparison, an
increment and one read of the monotonic clock.

>>> p = Progress()
>>> p.enter("load", StageBudget(5))
>>> p.progress("rows 0-999"), p.progress("rows 0-999"), p.progress("rows 1000-1999")
(True, False, True)
>>> p.version
3
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from ai_lease.timeouts import StageBudget

__all__ = ["Progress"]

_NO_MARKER = object()
_BEFORE_ANY_STAGE = StageBudget(60.0)


class Progress:
    """Where the job is and when it last moved forward (monotonic clock).

    ``progress(marker)`` counts only when the job moved: calling it again with the marker
    it was last given (the same batch, the same retry, the same status) is not progress.
    Without a marker every call counts, so call it only for real steps forward.
    """

    __slots__ = ("_marker", "budget", "clock", "last_at", "stage", "thread_ident", "version")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.stage: str | None = None
        self.budget = _BEFORE_ANY_STAGE
        self.version = 0
        self.last_at = clock()
        self.thread_ident: int | None = None  # set while a sync stage runs in a worker thread
        self._marker: object = _NO_MARKER

    def enter(self, stage: str, budget: StageBudget) -> None:
        """Start ``stage`` under ``budget``; entering a new stage is progress."""
        self.stage, self.budget, self._marker = stage, budget, _NO_MARKER
        self.version += 1
        self.last_at = self.clock()

    def progress(self, marker: Hashable | None = None) -> bool:
        """Record a step forward; return False (and record nothing) for a repeated marker."""
        if marker is not None:
            if marker == self._marker:
                return False
            self._marker = marker
        self.version += 1
        self.last_at = self.clock()
        return True

    def idle(self, now: float | None = None) -> float:
        """Seconds since the last real progress."""
        return (self.clock() if now is None else now) - self.last_at

    def __repr__(self) -> str:
        return f"<Progress stage={self.stage!r} version={self.version} idle={self.idle():.2f}s>"
