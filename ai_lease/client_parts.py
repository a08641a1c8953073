"""The sides of a store a :class:`~ai_lease.client.Client` uses beyond the lease, each as a
:class:`ConfigError` naming the store when it has no such side; what a client tells of its
store (:class:`StoreSides`); and closing what a client opened."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

from ai_lease.errors import ConfigError, StoreDataLost
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import JobListing, LeaseStore
from ai_lease.lease.queue import JobQueue
from ai_lease.lease.slots import WAIT_TTL, SlotStore
from ai_lease.lease.timeline import JobTimeline

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ai_lease.lease.slot_hold import SlotHold
    from ai_lease.observe.store_metrics import StoreCollector
    from ai_lease.run.runner import Runner

__all__ = [
    "StoreSides",
    "admin_of",
    "close_all",
    "listing_of",
    "queue_of",
    "slots_of",
    "timeline_of",
]


class StoreSides:
    """What a client tells of its store besides its jobs: which sides it has, whether it
    lost data, its gauges; and the refusal once the client is closed."""

    store: LeaseStore
    _closed: bool
    _runner: Runner | None

    def serves(self, side: type) -> bool:
        """Whether the store has ``side``, a protocol of :mod:`ai_lease.lease` (``JobListing``,
        ``JobTimeline``, ``JobQueue``, ``JobAdmin``, ``DurationHistory``)."""
        return isinstance(self._open().store, side)

    async def data_lost(self) -> StoreDataLost | None:
        """The store's report that it lost data (a Redis restart without persistence), or
        None (no loss seen, or a store that cannot lose data so)."""
        check = getattr(self._open().store, "data_lost", None)
        loss: StoreDataLost | None = await check() if check is not None else None
        return loss

    def watch_gauges(self, registry: CollectorRegistry) -> StoreCollector:
        """The store's gauges (queue, leases, workers: docs/observability.md) on ``registry``,
        called on the store's loop; ``registry.unregister(collector)`` before closing."""
        from ai_lease.observe.store_metrics import watch_store

        return watch_store(registry, self._open().store)

    def slot(
        self,
        limit: str,
        *,
        capacity: int,
        ttl: float = 30.0,
        max_wait: float = 60.0,
        priority: int = 0,
        wait_ttl: float = WAIT_TTL,
    ) -> SlotHold:
        """Hold one of ``capacity`` slots of ``limit`` around your own calls, shared by every
        process on this store (see :class:`~ai_lease.lease.slot_hold.SlotHold`)::

            async with client.slot("openai:gpt-4o-mini", capacity=4, max_wait=30):
                answer = await my_model_call()

        Waits first come, first served (a higher ``priority`` first) up to ``max_wait``
        seconds (:class:`SlotWaitTimeout`); renews every ``ttl / 3`` while the block runs; a
        slot lost meanwhile cancels the block (:class:`SlotLost`); leaving releases it."""
        from ai_lease.lease.fence import default_node_id, new_owner_id
        from ai_lease.lease.slot_hold import SlotHold

        runner = self._runner
        node = runner.node_id if runner is not None else default_node_id()
        return SlotHold(
            slots_of(self._open().store),
            limit,
            new_owner_id(node),
            capacity=capacity,
            ttl=ttl,
            max_wait=max_wait,
            priority=priority,
            wait_ttl=wait_ttl,
        )

    def _open(self) -> Self:
        """This client, unless it was closed (then a RuntimeError that says so)."""
        if self._closed:
            raise RuntimeError(f"this client is closed ({self!r}): open another with connect()")
        return self


def admin_of(store: LeaseStore) -> JobAdmin:
    """``store``'s :class:`JobAdmin` side, or a :class:`ConfigError` saying it has none."""
    if not isinstance(store, JobAdmin):
        raise ConfigError(f"{store!r} cannot retry, remove or prune jobs")
    return store


def listing_of(store: LeaseStore) -> JobListing:
    """``store``'s :class:`JobListing` side (pages and counts)."""
    if isinstance(store, JobListing):
        return store
    raise ConfigError(f"{store!r} cannot list jobs")


def timeline_of(store: LeaseStore) -> JobTimeline:
    """``store``'s :class:`JobTimeline` side (a job's events)."""
    if isinstance(store, JobTimeline):
        return store
    raise ConfigError(f"{store!r} keeps no timeline")


def queue_of(store: LeaseStore) -> JobQueue:
    """``store``'s :class:`JobQueue` side (the workers' queue)."""
    if isinstance(store, JobQueue):
        return store
    raise ConfigError(f"{store!r} keeps no job queue")


def slots_of(store: LeaseStore) -> SlotStore:
    """``store``'s :class:`SlotStore` side (provider slots)."""
    if isinstance(store, SlotStore):
        return store
    raise ConfigError(f"{store!r} keeps no provider slots")


async def close_all(resources: tuple[Any, ...]) -> None:
    """``aclose()`` each, in order; the first error is raised after all were tried."""
    first: BaseException | None = None
    for resource in resources:
        try:
            await resource.aclose()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first
