"""The stream guard: first-token, idle and total timeouts, progress per content chunk, cleanup."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from ai_lease.errors import (
    FirstTokenTimeout,
    ProviderError,
    StageTimeout,
    StreamIdleTimeout,
    StreamTotalTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest, Delta, Usage
from ai_lease.run.stream_guard import StreamGuard, guarded_completion
from ai_lease.testing.clock import VirtualClock, VirtualLoop, on_virtual_time
from ai_lease.testing.scripted import Pause, Raise, ScriptedProvider, Stall, Step
from ai_lease.timeouts import StreamTimeouts

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
SLACK = 0.1  # how far from its budget a timeout may fire


def loop_clock() -> VirtualClock:
    """The running loop's clock, handed to every guard and progress tracker here. Every test
    here runs on virtual time (``on_virtual_time``): the guard waits on the loop's timers
    only, so its budgets are measured exactly, on a loaded machine as on an idle one, and a
    5 s stall takes no real time."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop)
    return loop.clock


def timeouts(first_token: float = 5.0, idle: float = 5.0, total: float = 10.0) -> StreamTimeouts:
    return StreamTimeouts(first_token=first_token, idle=idle, total=total)


class Closed:
    """Records whether a wrapped stream's ``finally`` ran."""

    def __init__(self) -> None:
        self.closed = False

    async def wrap(self, stream: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
        try:
            async for delta in stream:
                yield delta
        finally:
            self.closed = True


def scripted(steps: Sequence[Step]) -> AsyncIterator[Delta]:
    return ScriptedProvider(steps).stream(REQUEST)


async def empties(every: float = 0.05) -> AsyncIterator[Delta]:
    """A provider stream that sends only empty deltas (keep-alives), forever. (A
    finish-only delta is not one: it ends the answer, see test_whole_answers.py.)"""
    while True:
        await asyncio.sleep(every)
        yield Delta()
        yield Delta("")


async def timed_collect(guard: StreamGuard, stream: AsyncIterator[Delta]) -> float:
    """Collect ``stream`` expecting it to raise; return how long it took."""
    started = loop_clock()()
    with pytest.raises(StageTimeout):
        await guard.collect(stream)
    return loop_clock()() - started


@on_virtual_time
async def test_first_token_timeout_fires_near_its_budget() -> None:
    """A stream with no content raises FirstTokenTimeout about first_token after the start."""
    guard = StreamGuard(timeouts(first_token=0.3), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(FirstTokenTimeout) as info:
        await guard.collect(scripted([Stall()]))
    elapsed = loop_clock()() - started
    assert abs(elapsed - 0.3) <= SLACK
    assert (info.value.budget_s, info.value.chunks, info.value.text) == (0.3, 0, "")


@on_virtual_time
async def test_first_token_timeout_applies_to_a_slow_first_chunk() -> None:
    """A first chunk that would arrive after first_token never gets the chance."""
    guard = StreamGuard(timeouts(first_token=0.2), clock=loop_clock())
    with pytest.raises(FirstTokenTimeout):
        await guard.collect(scripted([Pause(2.0), "late"]))
    assert guard.chunks == 0


@on_virtual_time
async def test_idle_timeout_after_some_content_carries_what_was_received() -> None:
    """A stream that goes quiet after content raises StreamIdleTimeout with chunks and text."""
    guard = StreamGuard(timeouts(first_token=1.0, idle=0.3), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(StreamIdleTimeout) as info:
        await guard.collect(scripted(["Hello", Pause(0.05), " wor", "ld", Stall()]))
    elapsed = loop_clock()() - started
    assert (info.value.budget_s, info.value.chunks, info.value.text) == (0.3, 3, "Hello world")
    assert 0.3 + 0.05 - SLACK <= elapsed <= 0.3 + 0.05 + SLACK


@on_virtual_time
async def test_idle_after_first_token_fires_at_idle_not_at_first_token() -> None:
    """With first_token longer than idle, a stall right after the first chunk is caught
    idle seconds after that chunk, not when the first-token budget would have ended."""
    guard = StreamGuard(timeouts(first_token=2.0, idle=0.2), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(StreamIdleTimeout):
        await guard.collect(scripted(["a", Stall()]))
    assert loop_clock()() - started <= 0.2 + SLACK


@on_virtual_time
async def test_a_pause_longer_than_idle_between_chunks_times_out() -> None:
    """A gap between content chunks longer than idle raises StreamIdleTimeout."""
    guard = StreamGuard(timeouts(first_token=1.0, idle=0.2), clock=loop_clock())
    with pytest.raises(StreamIdleTimeout) as info:
        await guard.collect(scripted(["a", Pause(1.0), "b"]))
    assert (info.value.chunks, info.value.text) == (1, "a")


@on_virtual_time
async def test_slow_drip_passes_idle_but_is_stopped_by_total() -> None:
    """Content every 0.15 s never trips idle 0.3 s, but the total budget stops the stream."""
    drip: list[Step] = [s for _ in range(40) for s in (Pause(0.15), "x")]
    guard = StreamGuard(timeouts(first_token=0.3, idle=0.3, total=0.8), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(StreamTotalTimeout) as info:
        await guard.collect(scripted(drip))
    elapsed = loop_clock()() - started
    assert abs(elapsed - 0.8) <= SLACK
    assert info.value.budget_s == 0.8
    assert 3 <= info.value.chunks <= 6
    assert info.value.text == "x" * info.value.chunks


@on_virtual_time
async def test_total_fires_before_first_token_when_shorter() -> None:
    """With total shorter than first_token, the total budget is the one that fires."""
    guard = StreamGuard(timeouts(first_token=5.0, total=0.2), clock=loop_clock())
    with pytest.raises(StreamTotalTimeout) as info:
        await guard.collect(scripted([Stall()]))
    assert info.value.budget_s == 0.2


@pytest.mark.parametrize("budget", ["first_token", "idle"])
@on_virtual_time
async def test_empty_deltas_do_not_hold_the_timer_off(budget: str) -> None:
    """Empty deltas every 50 ms are not content: the timer still fires."""
    if budget == "first_token":
        guard = StreamGuard(timeouts(first_token=0.3), clock=loop_clock())
        stream = empties()
        expected: type[StageTimeout] = FirstTokenTimeout
    else:
        guard = StreamGuard(timeouts(first_token=1.0, idle=0.3), clock=loop_clock())
        stream = _text_then(empties())
        expected = StreamIdleTimeout
    started = loop_clock()()
    with pytest.raises(expected) as info:
        await guard.collect(stream)
    elapsed = loop_clock()() - started
    assert abs(elapsed - 0.3) <= SLACK
    assert info.value.chunks == (0 if budget == "first_token" else 1)


async def _text_then(rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    yield Delta(text="hi")
    async for delta in rest:
        yield delta


@on_virtual_time
async def test_empty_deltas_are_not_progress() -> None:
    """Keep-alive deltas do not move the progress tracker."""
    tracker = Progress(loop_clock())
    guard = StreamGuard(timeouts(first_token=0.2), tracker)
    with pytest.raises(FirstTokenTimeout):
        await guard.collect(empties())
    assert tracker.version == 0


@on_virtual_time
async def test_progress_is_marked_once_per_content_chunk() -> None:
    """The tracker's version grows by exactly the number of content chunks."""
    tracker = Progress(loop_clock())
    tracker.progress("before")
    before = tracker.version
    stream = ScriptedProvider(["a", "b", "", "c", "d"]).stream(REQUEST)
    completion = await StreamGuard(timeouts(), tracker).collect(stream)
    assert completion.chunks == 4
    assert tracker.version == before + 4


@on_virtual_time
async def test_repeated_identical_chunks_are_each_progress() -> None:
    """Two equal content chunks are two steps forward (no marker deduplication per chunk)."""
    tracker = Progress(loop_clock())
    await StreamGuard(timeouts(), tracker).collect(scripted(["same", "same", "same"]))
    assert tracker.version == 3


@on_virtual_time
async def test_success_collects_text_finish_reason_and_usage() -> None:
    """A whole stream yields the joined text, its finish reason, usage and chunk count."""
    provider = ScriptedProvider(["Hel", "lo", Pause(0.01), " there"], finish_reason="length")
    completion = await guarded_completion(provider, REQUEST, timeouts(), None)
    assert completion.text == "Hello there"
    assert completion.finish_reason == "length"
    assert completion.usage == Usage(prompt_tokens=1, completion_tokens=3)
    assert completion.chunks == 3


@on_virtual_time
async def test_guard_records_first_token_latency() -> None:
    """first_token_s is the time from the start to the first content chunk."""
    guard = StreamGuard(timeouts(), clock=loop_clock())
    await guard.collect(scripted([Pause(0.1), "a"]))
    assert guard.first_token_s is not None
    assert 0.1 - 0.02 <= guard.first_token_s <= 0.1 + SLACK


@on_virtual_time
async def test_upstream_is_closed_when_a_timeout_fires() -> None:
    """A timeout closes the provider's stream (its finally runs before collect raises)."""
    seen = Closed()
    with pytest.raises(FirstTokenTimeout):
        await StreamGuard(timeouts(first_token=0.2), clock=loop_clock()).collect(
            seen.wrap(scripted([Stall()]))
        )
    assert seen.closed


@on_virtual_time
async def test_upstream_is_closed_after_idle_timeout() -> None:
    """An idle timeout mid-stream also closes the provider's stream."""
    seen = Closed()
    with pytest.raises(StreamIdleTimeout):
        await StreamGuard(timeouts(idle=0.2), clock=loop_clock()).collect(
            seen.wrap(scripted(["a", Stall()]))
        )
    assert seen.closed


@on_virtual_time
async def test_upstream_is_closed_on_success() -> None:
    """A stream consumed to its end is closed too."""
    seen = Closed()
    await StreamGuard(timeouts(), clock=loop_clock()).collect(seen.wrap(scripted(["a", "b"])))
    assert seen.closed


@on_virtual_time
async def test_provider_error_mid_stream_propagates_unchanged() -> None:
    """An error raised by the provider is not turned into a timeout, and the stream is closed."""
    seen = Closed()
    error = ProviderError("connection reset", retryable=True)
    guard = StreamGuard(timeouts(idle=0.3), clock=loop_clock())
    with pytest.raises(ProviderError) as info:
        await guard.collect(seen.wrap(scripted(["a", Pause(0.05), Raise(error)])))
    assert info.value is error
    assert seen.closed
    assert guard._handle is not None and guard._handle.cancelled()


@on_virtual_time
async def test_outside_timeout_propagates_as_timeout_error() -> None:
    """An asyncio.timeout around collect that fires first raises TimeoutError, not a stream one."""
    seen = Closed()
    guard = StreamGuard(timeouts(first_token=5.0), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await guard.collect(seen.wrap(scripted([Stall()])))
    assert loop_clock()() - started < 0.2 + SLACK
    assert seen.closed
    assert guard._handle is not None and guard._handle.cancelled()


@on_virtual_time
async def test_outside_cancel_propagates_as_cancellation() -> None:
    """Cancelling the consuming task raises CancelledError, never a stream timeout."""
    guard = StreamGuard(timeouts(first_token=5.0, idle=5.0), clock=loop_clock())
    task = asyncio.create_task(guard.collect(scripted(["a", Stall()])))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert guard._handle is not None and guard._handle.cancelled()


@on_virtual_time
async def test_guard_timeout_inside_an_outer_timeout_is_the_guards() -> None:
    """When the guard fires first under a longer asyncio.timeout, the stream timeout wins
    and the outer timeout neither fires nor is left cancelling."""
    guard = StreamGuard(timeouts(first_token=0.2), clock=loop_clock())
    with pytest.raises(FirstTokenTimeout):
        async with asyncio.timeout(5.0) as outer:
            await guard.collect(scripted([Stall()]))
    assert not outer.expired()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


@on_virtual_time
async def test_task_is_not_left_cancelling_after_a_stream_timeout() -> None:
    """After a stream timeout the task can keep awaiting (no stray cancellation)."""
    with pytest.raises(StreamIdleTimeout):
        await StreamGuard(timeouts(idle=0.2), clock=loop_clock()).collect(scripted(["a", Stall()]))
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # would raise CancelledError if a cancel were still pending


@on_virtual_time
async def test_timer_handle_is_cancelled_after_success() -> None:
    """No watchdog timer is left scheduled after a successful collect."""
    guard = StreamGuard(timeouts(first_token=0.3, idle=0.3), clock=loop_clock())
    await guard.collect(scripted(["a", Pause(0.05), "b"]))
    assert guard._handle is not None and guard._handle.cancelled()


@on_virtual_time
async def test_timer_handle_is_cancelled_after_a_rearm_and_success() -> None:
    """After the watchdog re-arms on content, the latest handle is cancelled at the end."""
    guard = StreamGuard(timeouts(first_token=0.1, idle=0.15, total=5.0), clock=loop_clock())
    steps: list[Step] = [s for _ in range(6) for s in ("x", Pause(0.08))]
    completion = await guard.collect(scripted(steps))
    assert completion.text == "x" * 6
    assert guard._handle is not None and guard._handle.cancelled()
    # The loop has no live timer of ours left to fire later.
    loop = asyncio.get_running_loop()
    live = [h for h in getattr(loop, "_scheduled", []) if not h.cancelled()]
    assert all(getattr(h, "_callback", None) != guard._wake for h in live)


@on_virtual_time
async def test_injected_clock_drives_the_deadlines() -> None:
    """The guard reads its deadlines from the injected clock, not from the loop's."""
    fake_now = [1000.0]
    guard = StreamGuard(timeouts(first_token=60.0), clock=lambda: fake_now[0])

    async def stream() -> AsyncIterator[Delta]:
        yield Delta(text="a")
        fake_now[0] += 59.0  # a minute passes on the guard's clock in no real time
        yield Delta(text="b", finish_reason="stop")

    completion = await guard.collect(stream())
    assert completion.text == "ab"
    assert guard.first_token_s == 0.0
    assert guard.last_content_at == 1059.0


# -- batches: the deltas of one network read together ------------------------------------------


class Batched:
    """A provider offering ``stream_batches``: each script item is one read's deltas, or a
    pause in seconds."""

    name = "batched"

    def __init__(self, script: Sequence[Sequence[Delta] | float]) -> None:
        self.script = script
        self.closed = False
        self.per_delta_calls = 0

    async def stream_batches(self, request: ChatRequest) -> AsyncIterator[Sequence[Delta]]:
        try:
            for item in self.script:
                if isinstance(item, float):
                    await asyncio.sleep(item)
                else:
                    yield item
        finally:
            self.closed = True

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.per_delta_calls += 1
        async for batch in self.stream_batches(request):
            for delta in batch:
                yield delta

    async def complete(self, request: ChatRequest) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


@on_virtual_time
async def test_a_batch_is_one_step_of_progress_and_keeps_every_delta() -> None:
    """The guard takes batches when offered: text in order, one progress mark per batch
    with content, none for a batch of role/empty/usage deltas."""
    provider = Batched(
        [
            [Delta(), Delta("")],  # role chunk, keep-alive: not content
            [Delta("Hel"), Delta("lo"), Delta(" world")],
            [Delta(finish_reason="stop"), Delta(usage=Usage(3, 3))],
        ]
    )
    progress = Progress(loop_clock())
    before = progress.version
    guard = StreamGuard(timeouts(), progress)
    completion = await guard.call(provider, REQUEST)
    assert (completion.text, completion.finish_reason) == ("Hello world", "stop")
    assert (completion.usage, completion.chunks) == (Usage(3, 3), 3)
    assert progress.version == before + 1
    assert provider.per_delta_calls == 0 and provider.closed


@on_virtual_time
async def test_idle_timeout_between_batches() -> None:
    """Batches of non-content do not hold the idle timer off; the stream is closed."""
    provider = Batched([[Delta("a")], *([0.05, [Delta()]] * 40)])
    guard = StreamGuard(timeouts(first_token=1.0, idle=0.3, total=5.0), clock=loop_clock())
    started = loop_clock()()
    with pytest.raises(StreamIdleTimeout) as caught:
        await guard.call(provider, REQUEST)
    elapsed = loop_clock()() - started
    assert 0.3 - 0.02 <= elapsed <= 0.3 + SLACK
    assert caught.value.text == "a" and provider.closed


@on_virtual_time
async def test_first_token_timeout_with_batches_and_per_delta_fallback() -> None:
    """A provider without ``stream_batches`` is consumed delta by delta, same deadlines."""
    guard = StreamGuard(timeouts(first_token=0.2), clock=loop_clock())
    with pytest.raises(FirstTokenTimeout):
        await guard.call(Batched([[Delta()], 5.0]), REQUEST)
    per_delta = ScriptedProvider(["a", "b"])
    completion = await StreamGuard(timeouts(), clock=loop_clock()).call(per_delta, REQUEST)
    assert completion.text == "ab"
