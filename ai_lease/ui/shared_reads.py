"""What all open live pages share: one store read per refresh for each thing they watch, and
a cap on how many live streams are open at once.

A live page asks for "the rows of this filter" or "this job" every interval. Three hundred
pages open on the same view must not make three hundred reads: :class:`SharedReads` hands
every caller within ``max_age`` of a read that same read's answer (callers that arrive while
it is in flight wait for it, single-flight), so the store sees one read per interval per
distinct view, however many pages show it. A page's live stream takes no answer read before
the stream opened (``newer_than``): that read may be older than the page it would update.
:class:`StreamSlots` bounds the open streams (each holds a connection and wakes every
interval): past the cap a new one is a 503.

>>> slots = StreamSlots(1)
>>> slots.take(), slots.take()
(True, False)
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable

__all__ = ["MAX_STREAMS", "SharedReads", "StreamSlots"]

MAX_STREAMS = 100
"""Live streams a dashboard serves at once by default (``create_app(max_streams=)``)."""

Read = Callable[[], Awaitable[tuple[object, Callable[[], str]]]]


class SharedReads:
    """Single-flight, ``max_age``-fresh answers per view key; at most ``size`` views kept."""

    def __init__(self, size: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        self._size, self._clock = size, clock
        self._answers: OrderedDict[Hashable, tuple[float, object, str]] = OrderedDict()
        self._locks: dict[Hashable, asyncio.Lock] = {}

    def now(self) -> float:
        """The time on this cache's clock (for ``newer_than``)."""
        return self._clock()

    async def get(
        self, view: Hashable, read: Read, max_age: float, newer_than: float | None = None
    ) -> tuple[object, str]:
        """(state, rendered HTML) of ``view``: the last read's if it is fresh (begun less than
        ``max_age`` ago, and after ``newer_than`` when given), else a new one (one for every
        caller waiting now)."""
        lock = self._locks.setdefault(view, asyncio.Lock())
        async with lock:
            fresh = self._fresh(view, max_age, newer_than)
            if fresh is not None:
                return fresh
            begun = self._clock()
            state, render = await read()
            self._keep(view, begun, state, render)
            return self._answers[view][1:]

    def _fresh(
        self, view: Hashable, max_age: float, newer_than: float | None
    ) -> tuple[object, str] | None:
        kept = self._answers.get(view)
        if kept is None or self._clock() - kept[0] >= max_age:
            return None
        if newer_than is not None and kept[0] < newer_than:
            return None
        return kept[1], kept[2]

    def _keep(self, view: Hashable, begun: float, state: object, render: Callable[[], str]) -> None:
        kept = self._answers.pop(view, None)
        html = kept[2] if kept is not None and kept[1] == state else render()  # unchanged: as is
        self._answers[view] = (begun, state, html)
        while len(self._answers) > self._size:
            old, _ = self._answers.popitem(last=False)
            lock = self._locks.get(old)
            if lock is not None and not lock.locked():
                del self._locks[old]


class StreamSlots:
    """A count of open live streams with a cap."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"max_streams must be at least 1 (got {cap!r})")
        self.cap, self.open = cap, 0

    def take(self) -> bool:
        """Take a slot; False when all ``cap`` are taken."""
        if self.open >= self.cap:
            return False
        self.open += 1
        return True

    def give_back(self) -> None:
        self.open = max(0, self.open - 1)

    def __repr__(self) -> str:
        return f"StreamSlots(open={self.open}, cap={self.cap})"
