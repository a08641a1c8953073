"""What ``ai-lease worker`` serves and logs: Prometheus metrics (and the store's gauges)
while it runs, and one plain stderr line per event worth an operator's eye."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from ai_lease.redaction import redact

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.lease.events import Event
    from ai_lease.observe.metrics import Metrics

__all__ = ["log_job_event", "log_worker_event", "new_metrics", "serving", "watching"]


def new_metrics() -> Metrics:
    # prometheus_client brings its HTTP server: imported only when metrics are asked for.
    from ai_lease.observe.metrics import Metrics

    return Metrics()


@contextlib.contextmanager
def serving(metrics: Metrics | None, port: int, host: str) -> Iterator[None]:
    """``metrics`` served at http://HOST:PORT/metrics while the block runs (if any)."""
    if metrics is None:
        yield
        return
    from ai_lease.observe.metrics import serve_metrics

    server = serve_metrics(metrics, port, host)
    try:
        yield
    finally:
        server.close()


@contextlib.contextmanager
def watching(metrics: Metrics | None, client: Client) -> Iterator[None]:
    """The store's gauges (queue, leases, workers: docs/observability.md) on ``metrics``
    while the block runs, if any; off again before the store closes."""
    if metrics is None:
        yield
        return
    collector = client.watch_gauges(metrics.registry)
    try:
        yield
    finally:
        metrics.registry.unregister(collector)


_WORKER_LOGGED = {"acquired", "stalled", "committed", "fenced", "failed", "retry", "released"}


def log_worker_event(event: Event) -> None:
    """One line on stderr per event: kind, job key, owner and token, detail."""
    who = f" {event.owner_id} token {event.token}" if event.token else ""
    click.echo(
        f"ai-lease worker: {event.kind:<14} {event.key}{who} {redact(event.detail)}".rstrip(),
        err=True,
    )


def log_job_event(event: Event) -> None:
    """The runner's events a worker's plain log shows (metrics and --log-json see them all)."""
    if event.kind in _WORKER_LOGGED:
        log_worker_event(event)
