"""Per-event lateness for bench/scale.py and bench/scale_procs.py: send stamps in, delays out.

The source stamps each content event with two readings of ``time.monotonic()`` (on Linux
``CLOCK_MONOTONIC``, one clock for every process of the machine, so a stamp taken in the
server's process compares with one taken in the client's): when it was *due* on the
stream's schedule and when it was *sent* (just before the write). The consumer keeps each
event's text in a :class:`StampedParts` list, which also records when the text reached the
consumer's code: the bare consumer's ``append`` of the delta's text, or the guard's own
``append`` of it into ``StreamGuard.text_parts`` (the guard collects: no iterator yields to
the caller; its append is where an event is delivered). Both consumers pay the same
Python-level ``append`` and one clock read per event.

* lateness = delivered - sent: what the client adds (socket wait, HTTP chunk and SSE
  framing, JSON parse, the guard, the event loop's queue);
* send lag = sent - due: how far behind its own schedule the server was (not counted in
  lateness; reported so an overloaded server is seen).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

__all__ = ["StampedParts", "lateness", "pct", "stamp", "summary"]

_now = time.monotonic
_append = list.append


def stamp(due: float) -> str:
    """An event's text: its send time and its due time (monotonic seconds), space-ended."""
    return f"{_now():.6f} {due:.6f} "


class StampedParts(list[str]):
    """A list of texts that records, per ``append``, the moment of it (``times``)."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, text: str) -> None:  # type: ignore[override]
        _append(self, text)
        _append(self.times, _now())


def lateness(parts: Iterable[StampedParts]) -> tuple[list[float], list[float]]:
    """(delivered - sent, sent - due) in ms for every stamped event of ``parts``."""
    late: list[float] = []
    lag: list[float] = []
    for p in parts:
        for text, at in zip(p, p.times, strict=True):
            sent, due = text.split(maxsplit=1)
            s = float(sent)
            late.append((at - s) * 1000)
            lag.append((s - float(due)) * 1000)
    return late, lag


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank, from below) of ``xs``; nan for none."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(ms: list[float]) -> dict[str, Any]:
    """p50 / p99 / max of a list of milliseconds, and how many."""
    s = sorted(ms)
    n = len(s)
    if not n:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"n": n, "p50": s[n // 2], "p99": s[min(n - 1, int(0.99 * n))], "max": s[-1]}
