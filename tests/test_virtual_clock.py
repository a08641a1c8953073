"""ai_lease.testing.VirtualClock: the one hand-moved clock the tests inject."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from ai_lease.lease.progress import Progress
from ai_lease.testing.clock import VirtualClock, VirtualLoop, on_virtual_time


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


@on_virtual_time
async def test_a_virtual_loop_jumps_to_its_next_timer() -> None:
    """30 s of sleeping and a 5 s timeout take that much virtual time, exactly, and no more."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop) and loop.time() == loop.clock() == 0.0
    started = time.monotonic()
    await asyncio.sleep(30)
    assert loop.time() == 30.0
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(5):
            await asyncio.Event().wait()
    assert loop.time() == 35.0
    assert time.monotonic() - started < 5  # real: that no real time was spent waiting


@on_virtual_time
async def test_a_virtual_loop_still_wakes_for_a_thread() -> None:
    """With no timer due, the loop waits for real I/O: a thread's call_soon_threadsafe."""
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    threading.Timer(0.05, loop.call_soon_threadsafe, (woken.set,)).start()
    await woken.wait()
    assert loop.time() == 0.0
