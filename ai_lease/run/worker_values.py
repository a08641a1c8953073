"""A worker's values: the checks of its settings, and a key held in quarantine."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MIN_SWEEP_INTERVAL", "Quarantined", "check_worker"]

MIN_SWEEP_INTERVAL = 0.01
"""Seconds; a shorter sweep interval is a busy loop against the store."""


@dataclass
class Quarantined:
    """A key whose look failed: why, how often it was looked at, when it may be again."""

    reason: str
    looks: int = 1
    next_look: float = 0.0  # time.monotonic()


def check_worker(concurrency: int, reserve: int, sweep_interval: float, grace: float) -> None:
    """Refuse values a worker cannot run with, naming the field."""
    for name, count, least in (("concurrency", concurrency, 1), ("recovery_reserve", reserve, 0)):
        if isinstance(count, bool) or not isinstance(count, int) or count < least:
            raise ValueError(f"Worker.{name}: must be an integer >= {least} (got {count!r})")
    for name, value, low in (
        ("sweep_interval", sweep_interval, MIN_SWEEP_INTERVAL),
        ("grace", grace, 0.0),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < low
        ):
            raise ValueError(
                f"Worker.{name}: must be a finite number of seconds >= {low:g} (got {value!r})"
            )
