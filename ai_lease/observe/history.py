"""Duration history: compact, mergeable histograms of how long stages really take.

Budgets can only be set well from measurements (the first seed, sections 10 and 15). Every
node aggregates durations locally in log-scale buckets (4 per doubling, 1 ms to ~70 min:
~19 % relative error, 88 integers per histogram) and adds them to the store now and then;
histograms from many nodes merge by adding counts. ``ai-lease tune`` reads them back and
suggests ``max_no_progress = max(floor, P99 x factor)`` per stage, and the stream budgets
from the first-token and longest-gap histograms.

Kinds: ``stage`` (each stage's duration), ``first_token`` (time to the first progress: text,
reasoning or a tool call's arguments), ``first_visible`` (time to the first answer text,
after any reasoning: shown beside it, no budget of its own), ``gap`` (each stream's longest
pause between content deltas), ``false_takeover`` (how long after its stall a "stalled"
stage finished after all: budgets that are too tight).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ai_lease.errors import CorruptRecord, CorruptSink
from ai_lease.observe.events import Event

__all__ = [
    "DurationHistory",
    "Histogram",
    "HistoryRecorder",
    "Suggestion",
    "bucket_of",
    "checked_histogram",
    "suggest",
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


class HistoryRecorder:
    """An event sink that aggregates durations in memory; :meth:`flush` adds them to the
    store (one round trip) at most every ``flush_interval`` seconds when called with
    ``force=False``. Events arrive per stage and per stream, never per chunk."""

    def __init__(
        self, store: DurationHistory, pipeline: str = "default", flush_interval: float = 10.0
    ) -> None:
        self.store, self.pipeline, self.flush_interval = store, pipeline, flush_interval
        self._pending: dict[Series, Counter[int]] = defaultdict(Counter)
        self._flushed_at = time.monotonic()

    def __call__(self, event: Event) -> None:
        kind = {
            "stage_done": "stage",
            "first_token": "first_token",
            "first_visible": "first_visible",
            "stream_gap": "gap",
            "false_takeover": "false_takeover",
        }.get(event.kind)
        if kind is not None and event.value is not None and event.stage:
            self._pending[(self.pipeline, kind, event.stage)][bucket_of(event.value)] += 1

    async def flush(self, *, force: bool = True) -> None:
        if not self._pending:
            return
        if not force and time.monotonic() - self._flushed_at < self.flush_interval:
            return
        pending, self._pending = self._pending, defaultdict(Counter)
        self._flushed_at = time.monotonic()
        try:
            await self.store.add_durations(pending)
        except Exception:
            for series, counts in pending.items():  # keep them for the next flush
                self._pending[series].update(counts)
            raise


@dataclass(frozen=True)
class Suggestion:
    pipeline: str
    kind: str
    stage: str
    samples: int
    p50: float | None
    p95: float | None
    p99: float | None
    p999: float | None
    suggested: float | None
    false_takeovers: int = 0


def suggest(
    histories: Mapping[Series, Mapping[int, int]],
    *,
    factor: float = 1.5,
    floor: float = 1.0,
    min_samples: int = 20,
) -> list[Suggestion]:
    """Per series: quantiles and ``max(floor, P99 x factor)`` once there are enough samples."""
    false = {(p, s): sum(c.values()) for (p, k, s), c in histories.items() if k == "false_takeover"}
    out = []
    for (pipeline, kind, stage), counts in sorted(histories.items()):
        if kind == "false_takeover":
            continue
        hist = Histogram(Counter(counts))
        p99 = hist.quantile(0.99)
        enough = hist.total >= min_samples and p99 is not None
        out.append(
            Suggestion(
                pipeline,
                kind,
                stage,
                hist.total,
                hist.quantile(0.5),
                hist.quantile(0.95),
                p99,
                hist.quantile(0.999),
                max(floor, p99 * factor) if enough and p99 else None,
                false.get((pipeline, stage), 0),
            )
        )
    return out


def merge_all(items: Iterable[Mapping[Series, Mapping[int, int]]]) -> dict[Series, dict[int, int]]:
    """Add several nodes' histograms together."""
    total: dict[Series, Counter[int]] = defaultdict(Counter)
    for item in items:
        for series, counts in item.items():
            total[series].update(counts)
    return {series: dict(counts) for series, counts in total.items()}
