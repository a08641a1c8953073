"""Where a runner's events go: whether any sink listens, and one place that hands them out.

A :class:`~ai_lease.Runner` and each :class:`~ai_lease.run.attempt.Attempt` it makes share one
:class:`Emitter`. The sinks are asked for on each event, so a sink installed after the
runner was built (a tracer, say) sees the events that follow. A sink may name the kinds it
takes (a ``kinds`` attribute, a set of strings): an event no sink takes is not built at all
(:meth:`Emitter.wants`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ai_lease.lease.base import Fence
from ai_lease.lease.events import Event, EventSink

__all__ = ["Emitter"]

_log = logging.getLogger("ai_lease.runner")


class Emitter:
    """Hands events to the sinks that ``sinks()`` gives (a None there is no sink).

    A sink that raises never breaks the job it observes: its first failure is logged, every
    failure counted (``failures``)."""

    def __init__(self, sinks: Callable[[], tuple[EventSink | None, ...]]) -> None:
        self._sinks = sinks
        self.failures = 0
        self._seen: tuple[EventSink | None, ...] = ()  # the sinks ``_taken`` was worked out for
        self._taken: frozenset[str] | None = frozenset()  # the kinds they take (None: all)

    @property
    def listening(self) -> bool:
        """Whether any sink takes events (none: no Event is built at all)."""
        return any(sink is not None for sink in self._sinks())

    def wants(self, kind: str) -> bool:
        """Whether any sink takes events of ``kind`` (a sink without ``kinds`` takes all)."""
        sinks = self._sinks()
        if sinks != self._seen:  # worked out again only when the sinks change
            self._seen, self._taken = sinks, _taken(sinks)
        taken = self._taken
        return taken is None or kind in taken

    def emit(
        self,
        kind: str,
        key: str,
        fence: Fence | None = None,
        detail: str = "",
        stage: str | None = None,
        value: float | None = None,
    ) -> None:
        """Build and hand out one event, if any sink takes its kind."""
        if not self.wants(kind):
            return
        owner, token = (fence.owner_id, fence.token) if fence else (None, None)
        self.emit_event(Event(kind, key, owner, token, stage, None, detail, value=value))

    def emit_event(self, event: Event) -> None:
        """Hand ``event`` to every sink (see the class docstring for a sink that raises)."""
        for sink in self._sinks():
            if sink is None:
                continue
            try:
                sink(event)
            except Exception:
                self.failures += 1
                if self.failures == 1:
                    _log.exception(
                        "event sink %r failed on a %r event (logged once; the job goes on)",
                        sink,
                        event.kind,
                    )


def _taken(sinks: tuple[EventSink | None, ...]) -> frozenset[str] | None:
    """The kinds ``sinks`` take together (None: every kind)."""
    taken: set[str] = set()
    for sink in sinks:
        if sink is not None:
            kinds = getattr(sink, "kinds", None)
            if kinds is None:
                return None
            taken.update(kinds)
    return frozenset(taken)
