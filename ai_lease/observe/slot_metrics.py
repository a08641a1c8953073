"""The provider-limit metrics (``[limits]``: :mod:`ai_lease.run.slot_call`), from its events.

- ``provider_slots_in_use{pipeline,limit}``: slots this process holds now (the fleet's
  count is the store's: ``slot_state``);
- ``provider_slot_wait_seconds{pipeline,limit}``: how long each call waited for its slot
  (0 when one was free);
- ``provider_rate_limited_total{pipeline,limit}``: model calls under a limit that the
  provider answered 429 (rate limited);
- ``provider_slot_capacity{pipeline,limit}``: an adaptive limit's concurrency as this process
  asks for it now (set at each change).

The ``limit`` label is the limit's name, from the settings (capped like every open label).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ai_lease.lease.events import Event

__all__ = ["SLOT_KINDS", "WAIT_BUCKETS", "SlotMetrics"]

WAIT_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

SLOT_KINDS = ("slot_taken", "slot_released", "rate_limited", "limit_adapted")
"""The events these metrics count."""


class SlotMetrics:
    """The four series on ``registry``; :meth:`observe` counts one event of
    :data:`SLOT_KINDS`. ``capped`` turns an open label value into a bounded one."""

    def __init__(self, registry: CollectorRegistry, capped: Callable[[str | None], str]) -> None:
        self._capped = capped
        labels = ["pipeline", "limit"]
        self.in_use = Gauge(
            "provider_slots_in_use",
            "Provider slots ([limits]) this process holds now, by limit.",
            labels,
            registry=registry,
        )
        self.wait = Histogram(
            "provider_slot_wait_seconds",
            "Seconds a model call waited for a provider slot, by limit.",
            labels,
            registry=registry,
            buckets=WAIT_BUCKETS,
        )
        self.rate_limited = Counter(
            "provider_rate_limited_total",
            "Model calls under a provider limit that the provider answered 429, by limit.",
            labels,
            registry=registry,
        )
        self.capacity = Gauge(
            "provider_slot_capacity",
            "An adaptive provider limit's concurrency as this process asks for it now.",
            labels,
            registry=registry,
        )

    def observe(self, event: Event, pipeline: str) -> None:
        attrs = event.attrs or {}
        limit = self._capped(str(attrs.get("limit", "")) or None)
        if event.kind == "slot_taken":
            if "window" not in attrs:  # a place in an rpm window is not held: never released
                self.in_use.labels(pipeline, limit).inc()
            self.wait.labels(pipeline, limit).observe(max(0.0, event.value or 0.0))
        elif event.kind == "slot_released":
            self.in_use.labels(pipeline, limit).dec()
        elif event.kind == "rate_limited":
            self.rate_limited.labels(pipeline, limit).inc()
        elif event.kind == "limit_adapted" and event.value is not None:
            self.capacity.labels(pipeline, limit).set(event.value)
