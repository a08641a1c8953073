"""The stream guard's finish grace, driven directly: once a finish reason has come the answer
is whole; a stream that then stays open is closed after ``min(finish_grace, idle)`` and its
answer kept (usage unknown), never timed out; a cancellation from outside still wins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ai_lease.errors import ConfigError
from ai_lease.providers.base import Completion, Delta, Usage
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.testing.clock import VirtualClock, VirtualLoop, on_virtual_time
from ai_lease.timeouts import StreamTimeouts


def loop_clock() -> VirtualClock:
    """The running loop's clock, handed to every guard here. Every test here runs on virtual
    time (``on_virtual_time``): the guard waits on the loop's timers only, so the grace is
    measured exactly, and a stream held open for 60 s takes no real time."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop)
    return loop.clock


class Held:
    """Yields ``deltas``, then holds the stream open until closed (records the close)."""

    def __init__(self, *deltas: Delta) -> None:
        self.deltas, self.closed = deltas, False

    async def stream(self) -> AsyncIterator[Delta]:
        try:
            for delta in self.deltas:
                yield delta
            await asyncio.sleep(60)  # virtual: held open on the tests' VirtualLoop
        finally:
            self.closed = True


async def _kept(timeouts: StreamTimeouts, *deltas: Delta) -> tuple[float, Held, Completion]:
    held = Held(*deltas)
    clock = loop_clock()
    started = clock()
    completion = await StreamGuard(timeouts, clock=clock).collect(held.stream())
    return clock() - started, held, completion


@on_virtual_time
async def test_a_finish_then_silence_is_kept_after_the_grace() -> None:
    """Text, a finish, then nothing: the answer comes back after the grace, usage unknown,
    and the stream is closed."""
    timeouts = StreamTimeouts(first_token=5, idle=5, total=30, finish_grace=0.2)
    took, held, completion = await _kept(timeouts, Delta("Paris"), Delta(finish_reason="stop"))
    assert (completion.text, completion.finish_reason, completion.usage) == ("Paris", "stop", None)
    assert 0.15 <= took < 2.0, took
    assert held.closed


@on_virtual_time
async def test_the_grace_is_never_longer_than_the_idle_budget() -> None:
    """finish_grace 10 s but idle 0.2 s: the answer is kept at the idle budget, whole."""
    timeouts = StreamTimeouts(first_token=5, idle=0.2, total=30, finish_grace=10)
    took, _, completion = await _kept(timeouts, Delta("a"), Delta(finish_reason="length"))
    assert completion.finish_reason == "length" and took < 2.0, took


@on_virtual_time
async def test_usage_before_the_grace_ends_is_kept() -> None:
    """A usage delta after the finish (within the grace) is part of the answer."""
    timeouts = StreamTimeouts(first_token=5, idle=5, total=30, finish_grace=0.2)
    _, _, completion = await _kept(
        timeouts, Delta("a"), Delta(finish_reason="stop"), Delta(usage=Usage(3, 1))
    )
    assert completion.usage == Usage(3, 1)


@on_virtual_time
async def test_a_finish_with_no_content_is_an_answer_not_a_first_token_timeout() -> None:
    """A finish and no content at all (an empty answer, the runner's to judge), then
    silence: the guard hands it back after the grace, not as FirstTokenTimeout."""
    timeouts = StreamTimeouts(first_token=3, idle=3, total=30, finish_grace=0.2)
    took, _, completion = await _kept(timeouts, Delta(finish_reason="stop"))
    assert (completion.text, completion.finish_reason) == ("", "stop")
    assert took < 2.0, took


@on_virtual_time
async def test_a_cancellation_from_outside_during_the_grace_wins() -> None:
    """The job is cancelled while the guard waits out the grace: CancelledError, not an
    answer (the guard only keeps what its own watchdog ended)."""
    timeouts = StreamTimeouts(first_token=5, idle=5, total=30, finish_grace=1.0)
    held = Held(Delta("a"), Delta(finish_reason="stop"))
    task = asyncio.create_task(StreamGuard(timeouts, clock=loop_clock()).collect(held.stream()))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held.closed


def test_finish_grace_is_validated_and_shown() -> None:
    """A finish_grace that is not a positive number is refused naming the field; a
    non-default one shows in the repr."""
    with pytest.raises(ConfigError, match=r"StreamTimeouts\.finish_grace"):
        StreamTimeouts(finish_grace=0)
    assert "finish_grace=0.5s" in repr(StreamTimeouts(finish_grace=0.5))
    assert "finish_grace" not in repr(StreamTimeouts())


def test_the_grace_is_a_setting() -> None:
    """`[stream] finish_grace` (AI_LEASE_STREAM__FINISH_GRACE) reaches the stream budgets;
    a non-positive one is refused naming the field."""
    from ai_lease.settings import load_settings

    settings = load_settings(env={"AI_LEASE_STREAM__FINISH_GRACE": "0.5"})
    assert settings.stream_timeouts().finish_grace == 0.5
    assert load_settings(env={}).stream_timeouts().finish_grace == 2.0
    with pytest.raises(ConfigError, match="finish_grace"):
        load_settings(env={"AI_LEASE_STREAM__FINISH_GRACE": "0"})
