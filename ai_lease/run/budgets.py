"""Adaptive stage budgets: learned from the recorded stage durations, capped by the
configured ones.

Once a stage has ``min_samples`` recorded durations (the store's histograms, written by
:class:`~ai_lease.observe.history.HistoryRecorder`), its ``max_no_progress`` becomes
``max(floor, P99 x factor)``, never above the configured budget (the ceiling). The
histograms are re-read at most every ``refresh_interval``; a corrupt one is skipped and
reported, never a reason to fail a job.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Mapping

from ai_lease.errors import CorruptSink, StoreUnavailable
from ai_lease.lease.base import LeaseStore
from ai_lease.lease.histogram import DurationHistory, Histogram
from ai_lease.timeouts import AdaptiveBudgets, LeaseTimings, StageBudget

__all__ = ["BudgetLearner", "learned_timings"]


class BudgetLearner:
    """Learns ``pipeline``'s stage budgets from ``store``'s histograms (``adaptive`` on),
    with ``configured`` as the ceiling."""

    def __init__(
        self,
        store: LeaseStore,
        configured: LeaseTimings,
        adaptive: AdaptiveBudgets | None,
        pipeline: str,
    ) -> None:
        self.store, self.configured, self.adaptive = store, configured, adaptive
        self.pipeline = pipeline
        self._read_at = -math.inf

    async def refresh(self, on_corrupt: CorruptSink) -> LeaseTimings | None:
        """Re-read the histograms if adaptive mode is on and they are due; return the
        learned timings, or None when nothing was re-read."""
        adaptive, store = self.adaptive, self.store
        if adaptive is None or not isinstance(store, DurationHistory):
            return None
        if time.monotonic() - self._read_at < adaptive.refresh_interval:
            return None
        self._read_at = time.monotonic()
        try:
            histories = await store.load_durations(on_corrupt=on_corrupt)
        except StoreUnavailable:
            return None
        return learned_timings(self.configured, histories, adaptive, self.pipeline)


def learned_timings(
    configured: LeaseTimings,
    histories: Mapping[tuple[str, str, str], Mapping[int, int]],
    adaptive: AdaptiveBudgets,
    pipeline: str,
) -> LeaseTimings:
    """``configured`` with each well-sampled stage's budget replaced by
    ``max(floor, P99 x factor)``, capped at the configured budget."""
    budgets = dict(configured.stage_budgets)
    for (name, kind, stage), counts in histories.items():
        if name != pipeline or kind != "stage":
            continue
        hist = Histogram(Counter(counts))
        p99 = hist.quantile(0.99)
        if hist.total < adaptive.min_samples or p99 is None:
            continue
        ceiling = configured.budget(stage)
        learned = min(ceiling.max_no_progress, max(adaptive.floor, p99 * adaptive.factor))
        budgets[stage] = StageBudget(learned, ceiling.deadline)
    return dataclasses.replace(configured, stage_budgets=budgets)
