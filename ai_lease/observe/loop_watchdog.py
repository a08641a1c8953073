"""Noticing a blocked event loop: a thread that logs the loop thread's stack when no
callback has run for ``after_s`` seconds.

Under ``--isolation task`` every job of a worker shares one event loop. A blocking call in
async code (``time.sleep``, a synchronous HTTP client, a CPU-bound parse) stops that loop:
no lease is renewed, no other job moves, and the signal handlers that drain the worker
never run. The loop cannot report this itself, so a daemon thread watches a heartbeat the
loop writes (a callback every ``after_s / 4``) and, once the heartbeat is ``after_s`` old,
emits one ``loop_blocked`` event per stall naming the frame the loop's thread is stuck in,
then ``loop_resumed`` when the loop runs again:

>>> async def main() -> None:
...     with watch_loop(JobLogger(), after_s=5.0):
...         await worker.run()                                      # doctest: +SKIP

It only reports: it cannot unblock the loop (``--isolation process`` can stop a stuck
child; ``asyncio.to_thread`` keeps a blocking call off the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator

from ai_lease.lease.events import Event, EventSink

__all__ = ["DEFAULT_AFTER_S", "LoopWatchdog", "watch_loop"]

DEFAULT_AFTER_S = 5.0
"""Seconds without a loop callback before the loop counts as blocked (one renew interval)."""
STACK_FRAMES = 40
"""The innermost frames of the loop thread's stack a ``loop_blocked`` event shows."""
_BEATS_PER_BOUND = 4  # heartbeats per ``after_s``: a stall is seen at most 25 % late


class LoopWatchdog:
    """Watches ``loop`` from a daemon thread; :meth:`start` from the loop's own thread.

    ``check(now)`` is the whole decision (the thread calls it every beat): it is public
    so that a test can drive it with its own clock.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_event: EventSink,
        *,
        after_s: float = DEFAULT_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not after_s > 0:
            raise ValueError(f"LoopWatchdog.after_s: must be positive seconds (got {after_s!r})")
        self.loop, self.on_event, self.after_s, self.clock = loop, on_event, after_s, clock
        self.beat_every = after_s / _BEATS_PER_BOUND
        self.beat_at = clock()  # the loop's last heartbeat
        self.blocked_since: float | None = None  # the heartbeat before a reported stall
        self.loop_thread: int | None = None
        self._stop = threading.Event()
        self._handle: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(target=self._watch, name="ai-lease loop watchdog")
        self._thread.daemon = True

    def start(self) -> None:
        """Begin the heartbeat (on the loop) and the watching thread."""
        self.loop_thread = threading.get_ident()
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (from the loop's thread; the thread ends within one beat)."""
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        self._thread.join(self.beat_every + 1.0)

    def _beat(self) -> None:
        self.beat_at = self.clock()
        if not self._stop.is_set():
            self._handle = self.loop.call_later(self.beat_every, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self.beat_every):
            self.check()

    def check(self, now: float | None = None) -> None:
        """Report a stall once (``loop_blocked``), and its end (``loop_resumed``)."""
        now = self.clock() if now is None else now
        beat_at = self.beat_at
        if self.blocked_since is not None:
            if beat_at > self.blocked_since:  # the loop ran again
                blocked = beat_at - self.blocked_since
                self._emit("loop_resumed", blocked, f"the event loop runs again ({blocked:.1f}s)")
                self.blocked_since = None
            return
        silent = now - beat_at
        if silent >= self.after_s:
            self.blocked_since = beat_at
            self._emit("loop_blocked", silent, self._blocked_text(silent))

    def _blocked_text(self, silent: float) -> str:
        return (
            f"the event loop ran no callback for {silent:.1f}s: a blocking call in async code "
            "(time.sleep, synchronous I/O, CPU-bound work) freezes every job of this worker, "
            "its lease renewals and its signal handling; move it to asyncio.to_thread, or run "
            "jobs with --isolation process. The loop's thread is at:\n" + self.loop_stack()
        )

    def loop_stack(self) -> str:
        """The innermost :data:`STACK_FRAMES` frames the loop's thread is running now."""
        frame = sys._current_frames().get(self.loop_thread or -1)
        if frame is None:
            return "(the loop's thread has ended)"
        return "".join(traceback.format_stack(frame, limit=STACK_FRAMES)).rstrip()

    def _emit(self, kind: str, seconds: float, detail: str) -> None:
        try:
            self.on_event(Event(kind, "", idle_s=seconds, detail=detail))
        except Exception:  # observability never breaks the worker
            logging.getLogger("ai_lease.loop").exception("loop watchdog: event sink failed")


@contextlib.contextmanager
def watch_loop(on_event: EventSink, *, after_s: float = DEFAULT_AFTER_S) -> Iterator[LoopWatchdog]:
    """A :class:`LoopWatchdog` over the running loop for the block (call it on the loop)."""
    dog = LoopWatchdog(asyncio.get_running_loop(), on_event, after_s=after_s)
    dog.start()
    try:
        yield dog
    finally:
        dog.stop()
