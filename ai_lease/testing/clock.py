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

Code that waits on the event loop's timers (``asyncio.sleep``, ``asyncio.timeout``,
``loop.call_at``) runs on a :class:`VirtualLoop`: its ``time()`` is a :class:`VirtualClock`,
and when nothing is ready it moves that clock to the next timer instead of waiting, so a
0.3 s budget fires after exactly 0.3 s of virtual time and no real time. Only for code that
waits on timers alone: a thread or a real socket would see the time jump under it.
"""

from __future__ import annotations

import asyncio
import functools
import math
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

__all__ = ["VirtualClock", "VirtualLoop", "on_virtual_time"]

P = ParamSpec("P")
T = TypeVar("T")


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


class _Jumping:
    """A selector that, with nothing ready and a timer due, moves the clock to the timer."""

    def __init__(self, selector: selectors.BaseSelector, clock: VirtualClock) -> None:
        self._selector, self._clock = selector, clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._selector.select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # no timer at all: only real I/O (another thread) can wake it
            return self._selector.select(None)
        self._clock.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:  # register, unregister, modify, get_map, close
        return getattr(self._selector, name)


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` is :attr:`clock` and which jumps to its next timer."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        super().__init__(_Jumping(selectors.DefaultSelector(), self.clock))  # type: ignore[arg-type]

    def time(self) -> float:
        return self.clock.now


def on_virtual_time(test: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Run an async test function on a fresh :class:`VirtualLoop` (``asyncio.Runner``): the
    decorated function is a plain one, so pytest runs it as it is, fixtures and
    parameters included. Inside, ``asyncio.get_running_loop().clock`` is its clock::

        @on_virtual_time
        async def test_budget() -> None:
            clock = asyncio.get_running_loop().clock
    """

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with asyncio.Runner(loop_factory=VirtualLoop) as runner:
            return runner.run(test(*args, **kwargs))

    return run
