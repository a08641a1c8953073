"""A store outage, said once: one line when it starts, a count while it lasts, one at its end.

Every job waiting through an outage retries its store call each poll interval; a line per
failed call (every 0.1 s per job in a test profile) buries the one thing worth knowing.
:class:`StoreOutage` turns them into ``store_unavailable`` once (the first error), again
at most every ``every`` seconds with the count so far, and ``store_reachable`` when a
call answers again:

>>> lines = []
>>> outage = StoreOutage(lambda kind, key, detail, n: lines.append(kind), every=10.0)
>>> outage.failed("job-1", "connection refused"); outage.failed("job-2", "connection refused")
>>> outage.reached("job-1")
>>> lines
['store_unavailable', 'store_reachable']

A call sent before the outage's first failure that answers after it does not end the outage
(``reached(key, sent_at)``): it was under way before, on a connection not yet cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["OUTAGE_COUNT_EVERY", "OutageSink", "StoreOutage"]

OUTAGE_COUNT_EVERY = 10.0
"""Seconds between the counting lines of an outage that lasts."""

OutageSink = Callable[[str, str, str, int], None]
"""``(kind, key, detail, failures)``: one line to say (``store_unavailable`` or
``store_reachable``), for the job whose call met it."""


class StoreOutage:
    """Failed store calls, said as one outage (see the module docstring)."""

    def __init__(
        self,
        say: OutageSink,
        *,
        every: float = OUTAGE_COUNT_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.say, self.every, self.clock = say, every, clock
        self.failures = 0  # failed calls in the outage under way
        self.since: float | None = None  # when it started (clock), None: none under way
        self._counted_at = 0.0

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, key: str, error: object) -> None:
        """A store call for ``key`` failed with ``error``."""
        now = self.clock()
        self.failures += 1
        if self.since is None:
            self.since = self._counted_at = now
            detail = f"{error} (said once: a count every {self.every:g}s while it lasts)"
            self.say("store_unavailable", key, detail, self.failures)
        elif now - self._counted_at >= self.every:
            self._counted_at = now
            detail = (
                f"still unavailable after {now - self.since:.1f}s: {self.failures} failed "
                f"calls so far; the latest: {error}"
            )
            self.say("store_unavailable", key, detail, self.failures)

    def reached(self, key: str, sent_at: float | None = None) -> None:
        """A store call for ``key`` answered: the outage, if one was under way, is over.

        ``sent_at`` (this object's clock): when that call was sent. An answer to a call sent
        before the outage's first failure was on its way already (a connection the outage had
        not cut yet): it says nothing about now, and ends nothing."""
        if self.since is None or (sent_at is not None and sent_at < self.since):
            return
        took, failures = self.clock() - self.since, self.failures
        self.since, self.failures = None, 0
        detail = f"the lease store answers again after {took:.1f}s ({failures} failed calls)"
        self.say("store_reachable", key, detail, failures)
