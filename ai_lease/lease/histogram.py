"""Duration histograms as a store keeps them: log-scale buckets (4 per doubling, 1 ms to
~70 min: ~19 % relative error, 88 integers per histogram) that merge by adding counts, the
:class:`DurationHistory` protocol of a store that keeps them, and the check a store runs on
each series it reads back (:func:`checked_histogram`).

>>> bucket_of(0.001), bucket_of(1.0)
(0, 40)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ai_lease.errors import CorruptRecord, CorruptSink

__all__ = [
    "BUCKETS",
    "DurationHistory",
    "Histogram",
    "Series",
    "bucket_of",
    "bucket_upper",
    "checked_histogram",
]

BASE_S = 0.001
STEPS_PER_DOUBLING = 4
BUCKETS = 88
_LOG_STEP = math.log(2) / STEPS_PER_DOUBLING

Series = tuple[str, str, str]
"""(pipeline, kind, stage)"""


def bucket_of(seconds: float) -> int:
    """The bucket holding ``seconds`` (bucket ``i`` ends at ``1 ms x 2^(i/4)``)."""
    if seconds <= BASE_S:
        return 0
    return min(BUCKETS - 1, math.ceil(math.log(seconds / BASE_S) / _LOG_STEP))


def bucket_upper(index: int) -> float:
    return float(BASE_S * math.exp(index * _LOG_STEP))


@dataclass
class Histogram:
    """Counts per bucket; merge by adding."""

    counts: Counter[int] = field(default_factory=Counter)

    def add(self, seconds: float, n: int = 1) -> None:
        self.counts[bucket_of(seconds)] += n

    def merge(self, other: Mapping[int, int]) -> None:
        self.counts.update(other)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding quantile ``q`` (None when empty)."""
        total = self.total
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return bucket_upper(index)
        return bucket_upper(max(self.counts))


_MAX_COUNT = 2**62  # counts are added across nodes: leave head-room below 64 bits


def checked_histogram(
    name: str, series: Any, buckets: Iterable[tuple[Any, Any]]
) -> tuple[Series, dict[int, int]]:
    """A stored series and its (bucket, count) pairs, checked; :class:`CorruptRecord`
    naming the series (``name``, as stored) when anything is not what ``add_durations``
    writes: three strings, buckets 0..87, counts 0..2^62."""

    def corrupt(detail: str) -> CorruptRecord:
        return CorruptRecord(name, detail, kind="duration histogram")

    if not (
        isinstance(series, list | tuple)
        and len(series) == 3
        and all(isinstance(part, str) for part in series)
    ):
        raise corrupt("the name is not [pipeline, kind, stage]")
    counts: dict[int, int] = {}
    for bucket, n in buckets:
        b, c = _small_int(bucket), _small_int(n)
        if b is None or not 0 <= b < BUCKETS:
            raise corrupt(f"bucket {str(bucket)[:20]!r} is not 0..{BUCKETS - 1}")
        if c is None or not 0 <= c <= _MAX_COUNT:
            raise corrupt(f"count {str(n)[:20]!r} of bucket {b} is not a count")
        counts[b] = c
    return (series[0], series[1], series[2]), counts


def _small_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str | bytes) and len(value) <= 20:
        try:
            return int(value)
        except ValueError:
            return None
    return None


@runtime_checkable
class DurationHistory(Protocol):
    """Where histograms are kept (both built-in stores).

    ``load_durations`` raises :class:`CorruptRecord` on a series that is not ours, unless
    ``on_corrupt`` is given: then that series is skipped and reported to it."""

    async def add_durations(self, counts: Mapping[Series, Mapping[int, int]]) -> None: ...

    async def load_durations(
        self, *, on_corrupt: CorruptSink | None = None
    ) -> dict[Series, dict[int, int]]: ...
