"""Duration history: what a node records of how long stages really take, and what
``ai-lease tune`` suggests from it.

Budgets can only be set well from measurements (the first seed, sections 10 and 15). Every
node aggregates durations locally (:class:`HistoryRecorder`, in the histograms of
:mod:`ai_lease.lease.histogram`) and adds them to the store now and then; histograms from
many nodes merge by adding counts. ``ai-lease tune`` reads them back and suggests
``max_no_progress = max(floor, P99 x factor)`` per stage, and the stream budgets from the
first-token and longest-gap histograms.

Kinds: ``stage`` (each stage's duration), ``first_token`` (time to the first progress: text,
reasoning or a tool call's arguments), ``first_visible`` (time to the first answer text,
after any reasoning: shown beside it, no budget of its own), ``gap`` (each stream's longest
pause between content deltas), ``false_takeover`` (how long after its stall a "stalled"
stage finished after all: budgets that are too tight).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ai_lease.lease.events import Event
from ai_lease.lease.histogram import DurationHistory, Histogram, Series, bucket_of

__all__ = ["HistoryRecorder", "Suggestion", "suggest"]


_SERIES = {  # the event kinds recorded, and the series each goes to
    "stage_done": "stage",
    "first_token": "first_token",
    "first_visible": "first_visible",
    "stream_gap": "gap",
    "false_takeover": "false_takeover",
}


class HistoryRecorder:
    """An event sink that aggregates durations in memory; :meth:`flush` adds them to the
    store (one round trip) at most every ``flush_interval`` seconds when called with
    ``force=False``. Events arrive per stage and per stream, never per chunk; ``kinds``
    names the ones it takes (no other is built for it)."""

    kinds = frozenset(_SERIES)

    def __init__(
        self, store: DurationHistory, pipeline: str = "default", flush_interval: float = 10.0
    ) -> None:
        self.store, self.pipeline, self.flush_interval = store, pipeline, flush_interval
        self._pending: dict[Series, Counter[int]] = defaultdict(Counter)
        self._flushed_at = time.monotonic()

    def __call__(self, event: Event) -> None:
        kind = _SERIES.get(event.kind)
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
