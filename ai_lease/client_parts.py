"""The sides of a store a :class:`~ai_lease.client.Client` uses beyond the lease, each as a
:class:`ConfigError` naming the store when it has no such side, and closing what a client
opened."""

from __future__ import annotations

from typing import Any

from ai_lease.errors import ConfigError
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import JobListing, LeaseStore
from ai_lease.lease.queue import JobQueue
from ai_lease.lease.timeline import JobTimeline

__all__ = ["admin_of", "close_all", "listing_of", "queue_of", "timeline_of"]


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
