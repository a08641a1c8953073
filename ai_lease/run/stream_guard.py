"""The stream guard: first-token, idle and total timeouts for a streamed model answer.

Per chunk the guard only reads the clock, counts and marks progress — no task, no
``wait_for``, no timer rescheduling (each of those costs 4-25 µs here, against ~5 µs to
parse a chunk). One timer handle, the **watchdog**, sleeps until the earliest deadline
that could fire; when it wakes it re-reads the deadlines, and either re-arms for the new
earliest one or cancels the consuming task, which then raises the typed timeout:

* :class:`FirstTokenTimeout`: no progress within ``first_token`` of the request;
* :class:`StreamIdleTimeout`: no progress within ``idle`` of the previous progress;
* :class:`StreamTotalTimeout`: the stream ran past ``total``.

A provider that can (``BatchStreaming`` in :mod:`ai_lease.providers.base`) hands over the
deltas of one network read together; the guard then reads the clock and marks progress once
per read. One whose ``announces_connection`` is true yields an empty batch first, once it
holds a connection: waiting for a free connection of its pool is not model latency, so the
guard's clocks start only then (the provider bounds that wait itself, with its own error).

Progress is any non-empty fragment: answer text, reasoning (a reasoning model's
``reasoning_content``) or tool-call arguments; so a model that thinks for longer than the
idle budget is not timed out. Role-only chunks, empty deltas and SSE keep-alive comments
neither count as progress nor hold the idle timer off. ``first_token_s`` is the time to the
first progress, ``first_visible_s`` to the first answer text. The answer is the text only:
reasoning is counted (its bytes, with tool-call arguments, count against
``max_answer_bytes`` like the text) but not kept; tool-call fragments are assembled into the
completion's ``tool_calls``, and a ``tool_calls`` finish reason is a whole answer. When a
timeout fires the provider's stream is closed, which closes its upstream connection.

Whatever the provider, a stream is whole only with a finish reason: one that ends without
(a server that stopped the answer, a wrapper that lost the last chunk) is
:class:`StreamInterrupted`, never a result. And once the finish reason has come the
answer *is* whole: the end marker after it (a usage chunk, ``[DONE]``, ``message_stop``,
Gemini's body end) is only its trailer, waited for at most ``min(finish_grace, idle)``
(:class:`~ai_lease.timeouts.StreamTimeouts`); a stream still open then (a buffering proxy)
is closed and its answer kept as it is (``held``; usage unknown if it had not come), never
timed out. An answer whose text outgrows
``StreamLimits.max_answer_bytes`` is :class:`StreamLimitExceeded`, and its stream is closed.
``on_first_token`` is called the moment the first progress arrives (not at the end).

**φ-accrual suspicion** (:mod:`ai_lease.observe.phi`): per batch the guard appends the gap
since the previous progress to a bounded deque (:data:`PHI_WINDOW`), nothing more. The
watchdog, when it arms, fits the gaps (once at least :data:`PHI_MIN_GAPS` are known) and
also sleeps until the moment φ would reach ``StreamTimeouts.phi_threshold``; if it wakes
there with no progress since, it calls ``on_suspected(phi, silence_s)`` once per stream
(an alert); with ``idle_policy="phi"`` that is also the idle decision
(:class:`StreamIdleTimeout`, "φ N after S s of silence"), ``idle`` staying the upper bound.
With fewer gaps it re-looks every :data:`PHI_RECHECK_S` until there are enough.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from ai_lease.errors import (
    FirstTokenTimeout,
    StreamIdleTimeout,
    StreamInterrupted,
    StreamLimitExceeded,
    StreamTotalTimeout,
)
from ai_lease.lease.progress import Progress
from ai_lease.observe.phi import crossing_s, normal_fit, phi_value
from ai_lease.providers.base import (
    ChatRequest,
    Completion,
    Delta,
    Provider,
    ToolCallDelta,
    Usage,
    assemble_tool_calls,
)
from ai_lease.timeouts import StreamLimits, StreamTimeouts

__all__ = ["PHI_MIN_GAPS", "PHI_WINDOW", "StreamGuard", "guarded_completion"]

PHI_WINDOW = 100
"""How many of a stream's latest gaps between progress the φ fit uses."""
PHI_MIN_GAPS = 8
"""Fewer gaps than this and φ says nothing: only the fixed idle budget applies."""
PHI_MIN_STD_S = 0.35
"""The least std (seconds) of a stream's gaps: a model streaming every 50 ms is suspected
after ~2 s of silence at φ 8 (0.05 + 5.61 x 0.35), not on a one-second hiccup."""
PHI_RECHECK_S = 0.5
"""While fewer than :data:`PHI_MIN_GAPS` gaps are known, the watchdog looks this often."""


class _PhiCheck(Exception):
    """The watchdog's marker for "look at φ now" (never raised)."""


class _Whole(Exception):
    """The watchdog's marker for "the finish came, its trailer did not: keep the answer"
    (never raised)."""


class StreamGuard:
    """Consumes one stream under :class:`StreamTimeouts`, marking progress per progress delta.

    >>> completion = await StreamGuard(StreamTimeouts(first_token=30, idle=10, total=300),
    ...                                progress).collect(provider.stream(request))  # doctest: +SKIP
    """

    def __init__(
        self,
        timeouts: StreamTimeouts,
        progress: Progress | None = None,
        *,
        clock: Callable[[], float] | None = None,
        limits: StreamLimits | None = None,
        on_first_token: Callable[[float], None] | None = None,
        on_suspected: Callable[[float, float], None] | None = None,
    ) -> None:
        # One clock for deadlines and progress: the tracker's, unless one is given.
        clock = clock or (progress.clock if progress is not None else time.monotonic)
        self.timeouts, self.progress, self.clock = timeouts, progress, clock
        self.limits = limits or StreamLimits()
        self.on_first_token = on_first_token  # called with first_token_s as it arrives
        self.on_suspected = on_suspected  # called with (φ, silence_s), once per stream
        self.suspected_phi: float | None = None  # φ when the stream was suspected
        self.gaps: deque[float] = deque(maxlen=PHI_WINDOW)  # between progress batches
        self.provider_name = ""
        self.started_at = 0.0
        self.last_content_at: float | None = None
        self.first_token_s: float | None = None  # to the first progress of any kind
        self.first_visible_s: float | None = None  # to the first answer text
        self.max_gap_s = 0.0  # the longest pause between two progress deltas
        self.text_parts: list[str] = []
        self.tool_parts: list[ToolCallDelta] = []  # tool-call fragments, assembled at the end
        self.reasoning_chars = 0  # reasoning received (an empty answer says where it went)
        self.finish: str | None = None  # the finish reason, once one came
        self.finished_at: float | None = None  # when it came: the finish grace runs from here
        self.usage: Usage | None = None
        self.held = False  # the stream stayed open past the finish grace: kept, not timed out
        self._fired: Exception | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._scope: asyncio.Timeout | None = None  # stops the stream when the watchdog fires
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the watchdog ---------------------------------------------------------------------------

    def _next_deadline(self) -> tuple[float, type[Exception], float]:
        t = self.timeouts
        total_at = self.started_at + t.total
        if self.finished_at is not None:  # whole: only its trailer (usage, [DONE]) is awaited
            grace = min(t.finish_grace, t.idle)
            return min(self.finished_at + grace, total_at), _Whole, grace
        if self.last_content_at is None:
            first_at = self.started_at + t.first_token
            return (
                (first_at, FirstTokenTimeout, t.first_token)
                if first_at < total_at
                else (total_at, StreamTotalTimeout, t.total)
            )
        idle_at = self.last_content_at + t.idle
        phi_at = self._phi_at(self.last_content_at)
        if phi_at < idle_at and phi_at < total_at:
            return phi_at, _PhiCheck, t.phi_threshold
        if idle_at < total_at:
            return idle_at, StreamIdleTimeout, t.idle
        return total_at, StreamTotalTimeout, t.total

    def _phi_at(self, last: float) -> float:
        """When the watchdog should look at φ: where it reaches the threshold, or a recheck
        while too few gaps are known (inf once the alert is out, under the fixed policy)."""
        if self.suspected_phi is not None:
            return float("inf")
        gaps = self.gaps
        if len(gaps) < PHI_MIN_GAPS:
            return self.clock() + PHI_RECHECK_S  # always ahead: a wake only re-arms
        mean, std = normal_fit(gaps, PHI_MIN_STD_S)
        return last + crossing_s(self.timeouts.phi_threshold, mean, std)

    def _arm(self, when: float | None = None) -> None:
        """Wake at ``when`` (our clock), or at the next deadline worked out now."""
        assert self._loop is not None
        if when is None:
            when, _, _ = self._next_deadline()
        if when != float("inf"):
            # Convert from our clock to the loop's clock (both monotonic, possibly offset).
            self._handle = self._loop.call_at(self._loop.time() + (when - self.clock()), self._wake)

    def _rearm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._arm()

    def _wake(self) -> None:
        when, error, budget = self._next_deadline()
        if self.clock() < when:  # content arrived since we armed: sleep until the new deadline
            self._arm(when)  # the deadline just worked out: φ's fit is not done twice
            return
        if error is _PhiCheck and not self._suspect():
            self._arm()  # an alert only: the fixed budgets still stand
            return
        if error is _Whole:  # the answer is kept as it is: no timeout
            self.held = True
            self._stop()
            return
        self._fired = self._fired or error(budget, self.chunks, "".join(self.text_parts))
        self._stop()

    def _stop(self) -> None:
        """End the stream now: the guard's ``asyncio.timeout`` scope expires, so it cancels
        the task and, on leaving, tells its own cancellation from one that came from outside."""
        scope = self._scope
        if scope is not None and not scope.expired():
            scope.reschedule(-1.0)  # due already: the scope cancels at the loop's next turn

    def _suspect(self) -> bool:
        """φ has reached the threshold: say so (once); True if that is the idle decision."""
        assert self.last_content_at is not None
        silence = self.clock() - self.last_content_at
        mean, std = normal_fit(self.gaps, PHI_MIN_STD_S)
        # Woken at (or after) the crossing, φ is at least the threshold: the max absorbs the
        # rounding of crossing_s and phi_value, which can read 7.999999999999997 for 8.
        phi = max(phi_value(silence, mean, std), self.timeouts.phi_threshold)
        self.suspected_phi = phi
        if self.on_suspected is not None:
            self.on_suspected(phi, silence)
        if self.timeouts.idle_policy != "phi":
            return False
        self._fired = fired = StreamIdleTimeout(silence, self.chunks, "".join(self.text_parts))
        fired.args = (
            f"the stream went idle: φ {phi:.1f} after {silence:.1f}s of silence (threshold "
            f"{self.timeouts.phi_threshold:g}, fixed idle budget {self.timeouts.idle:g}s; "
            f"{self.chunks} content chunks received)",
        )
        return True

    # -- consuming ------------------------------------------------------------------------------

    async def call(self, provider: Provider, request: ChatRequest) -> Completion:
        """Stream ``request`` from ``provider`` whole, by batches where it offers them."""
        # BatchStreaming, checked by attribute: isinstance() on a runtime Protocol costs ~5 µs
        stream_batches = getattr(provider, "stream_batches", None)
        self.provider_name = provider.name
        if stream_batches is not None:
            connecting = bool(getattr(provider, "announces_connection", False))
            return await self.collect_batches(stream_batches(request), connecting=connecting)
        return await self.collect(provider.stream(request))

    async def collect(self, stream: AsyncIterator[Delta]) -> Completion:
        """Consume ``stream`` whole; return the joined text, finish reason and usage."""
        try:
            return await self.collect_batches(_one_by_one(stream))
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def collect_batches(
        self, batches: AsyncIterator[Sequence[Delta]], *, connecting: bool = False
    ) -> Completion:
        """:meth:`collect` for a stream of batches (deltas that arrived together). With
        ``connecting``, the clocks start at the first batch (the provider's empty "connection
        held" batch), not before: a wait for a pooled connection is not the model's."""
        self._loop = asyncio.get_running_loop()
        self.started_at = self.clock()
        try:
            async with asyncio.timeout(None) as self._scope:
                if not connecting:
                    self._arm()
                finish, usage = await self._consume(batches, connecting)
        except TimeoutError:
            # Only the scope's own expiry is ours; a cancellation from outside stays one.
            if self._scope is None or not self._scope.expired():
                raise  # a TimeoutError of the stream's own
            if self._fired is not None:
                raise self._fired from None
            finish, usage = self.finish, self.usage  # held open past the grace: kept
        finally:
            if self._handle is not None:
                self._handle.cancel()
            aclose = getattr(batches, "aclose", None)
            if aclose is not None:
                await aclose()
        if finish is None:
            raise StreamInterrupted(
                "the stream ended", provider=self.provider_name, chunks=self.chunks
            )
        calls = assemble_tool_calls(self.tool_parts) if self.tool_parts else ()
        return Completion("".join(self.text_parts), finish, usage, self.chunks, calls)

    async def _consume(
        self, batches: AsyncIterator[Sequence[Delta]], connecting: bool
    ) -> tuple[str | None, Usage | None]:
        """The loop of :meth:`collect_batches`: per batch, the text kept, the clock read once
        and progress marked once; the finish reason and usage, at the end."""
        finish: str | None = None
        usage: Usage | None = None
        clock, parts, progress, calls = self.clock, self.text_parts, self.progress, self.tool_parts
        last: float | None = None  # a local mirror of a hot field: attribute reads cost
        size, max_size = 0, self.limits.max_answer_bytes
        async for batch in batches:
            content = len(parts)
            moved = False  # reasoning or tool-call arguments: progress, not answer text
            for text, finish_reason, delta_usage, reasoning, tool_calls in batch:
                if text:
                    parts.append(text)
                    # isascii() is a flag read: no encoding on the usual path
                    size += len(text) if text.isascii() else len(text.encode())
                if finish_reason:
                    finish = self._finished(finish_reason)
                if delta_usage is not None:
                    usage = self.usage = delta_usage
                if reasoning or tool_calls:
                    grown = _side_bytes(reasoning, tool_calls)
                    calls.extend(tool_calls)
                    size += grown
                    moved = moved or grown > 0
                    self.reasoning_chars += len(reasoning)
            if len(parts) == content and not moved:
                if connecting:  # the connection is held: the clocks start now
                    connecting = False
                    self.started_at = clock()
                    self._rearm()
                continue  # no progress: moves neither the deadlines nor the job
            if size > max_size:  # leaving the loop closes the stream and its connection
                raise StreamLimitExceeded(
                    "max_answer_bytes", max_size, provider=self.provider_name, chunks=content
                )
            now = clock()
            connecting = False
            self._seen(now, last, visible=len(parts) > content)
            last = now
            if progress is not None:  # Progress.progress(), inlined: one clock read
                progress.version += 1
                progress.last_at = now
        return finish, usage

    def _finished(self, reason: str) -> str:
        """A finish reason came: the answer is whole; from now the watchdog waits only
        ``finish_grace`` for the trailer (a usage chunk, ``[DONE]``, the body's end)."""
        self.finish = reason
        if self.finished_at is None:
            self.finished_at = self.clock()
            self._rearm()
        return reason

    def _seen(self, now: float, last: float | None, *, visible: bool) -> None:
        """Progress at ``now`` (the previous at ``last``): the first token's time, the
        longest gap, the first visible text's time, and the watchdog's idle clock."""
        if last is None:  # once per stream
            self._first_content(now)
        else:
            gap = now - last
            self.gaps.append(gap)  # φ's window (a bounded deque): fitted by the watchdog only
            if gap > self.max_gap_s:
                self.max_gap_s = gap
        if visible and self.first_visible_s is None:
            self.first_visible_s = now - self.started_at
        self.last_content_at = now  # the watchdog reads the attribute

    def _first_content(self, now: float) -> None:
        self.first_token_s = now - self.started_at
        self.last_content_at = now
        self._rearm()  # the idle deadline may be nearer than the first-token one
        if self.on_first_token is not None:
            self.on_first_token(self.first_token_s)

    @property
    def chunks(self) -> int:
        """Content deltas received so far."""
        return len(self.text_parts)


async def guarded_completion(
    provider: Provider,
    request: ChatRequest,
    timeouts: StreamTimeouts,
    progress: Progress | None,
    limits: StreamLimits | None = None,
) -> Completion:
    """Stream ``request`` from ``provider`` under the guard."""
    return await StreamGuard(timeouts, progress, limits=limits).call(provider, request)


def _side_bytes(reasoning: str, tool_calls: tuple[ToolCallDelta, ...]) -> int:
    """The bytes of a delta's progress that is not answer text (0: none, liveness only)."""
    size = len(reasoning.encode()) if reasoning else 0
    for call in tool_calls:
        size += len(call.arguments.encode())
    return size


async def _one_by_one(stream: AsyncIterator[Delta]) -> AsyncGenerator[tuple[Delta], None]:
    async for delta in stream:
        yield (delta,)
