"""Store-wide gauges, read from the store at scrape time: jobs, queue depth, leases, workers.

:class:`StoreCollector` is a ``prometheus_client`` custom collector. A scrape reads the store
through the store's own bounded calls, on the event loop that owns the store, and waits at
most ``timeout`` seconds for the answer; a reading younger than ``ttl`` seconds is served
again without asking. A slow or unreachable store never hangs a scrape: it yields the last
values read, ``store_up 0`` and their age (``store_read_age_seconds``).

>>> collector = watch_store(metrics.registry, store)   # inside the worker's loop # doctest: +SKIP

What each store answers, from the indexes it keeps (never a scan of the job records):

* SQLite: ``jobs{status}`` (one ``GROUP BY`` on the status index), ``queue_due`` /
  ``queue_scheduled`` (range counts on the queue's due index), ``leases_live`` /
  ``leases_lapsed`` (range counts on the status/expiry index), and the workers.
* Redis: the same but ``jobs{status}``: Redis keeps no count by status, and counting means
  reading every job hash (``SCAN`` over 100,000 records per scrape), so it is not exported.
  The queue and the lease index are sorted sets: one script of four ``ZCOUNT`` calls, one
  round trip. On Redis Cluster the lease index is not kept, so ``leases_*`` are left out too.
* PostgreSQL: all of SQLite's, in one statement (counts on the status, queue and expiry
  indexes).
Each store reads its own (``store.gauges()``, :class:`~ai_lease.lease.queue.GaugedStore`):
this module knows no schema and no key.
* Any other :class:`~ai_lease.lease.queue.JobQueue`: the workers.

Every worker reports the same store-wide values: aggregate them with ``max``, not ``sum``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ai_lease.errors import CorruptRecord
from ai_lease.job import Status
from ai_lease.lease.queue import GaugedStore, JobQueue, QueueGauges, WorkerInfo
from ai_lease.observe.metrics import MAX_LABEL_VALUES, OTHER
from ai_lease.redaction import redact

__all__ = ["STORE_GAUGES", "StoreCollector", "StoreReading", "read_store", "watch_store"]

log = logging.getLogger("ai_lease.metrics")

STATUSES = tuple(s.value for s in Status)
STORE_GAUGES = {
    "jobs": "Jobs in the store by status (SQLite, PostgreSQL: Redis keeps no count by status).",
    "queue_due": "Queued jobs due now (their look-again time has come).",
    "queue_scheduled": "Queued jobs due later (retries, and recovery looks at running jobs).",
    "leases_live": "Jobs an owner holds on a live lease.",
    "leases_lapsed": "Jobs whose lease lapsed or was handed back, not yet taken again.",
    "worker_running_jobs": "Jobs each live worker is running (as it last reported).",
    "worker_concurrency": "Jobs each live worker may run at once.",
    "store_up": "1 when the last read of the store answered in time, else 0.",
    "store_read_age_seconds": "Seconds since the values served were read from the store.",
    "store_read_seconds": "Seconds the last successful read of the store took.",
}


@dataclass(frozen=True, slots=True)
class StoreReading:
    """One read of the store; ``None``: this store does not keep that count."""

    jobs: Mapping[str, int] | None = None
    queue_due: int | None = None
    queue_scheduled: int | None = None
    leases_live: int | None = None
    leases_lapsed: int | None = None
    workers: tuple[WorkerInfo, ...] = ()


async def read_store(store: object) -> StoreReading:
    """What ``store`` can tell from its indexes (:meth:`GaugedStore.gauges`), and its
    workers."""
    counts = await store.gauges() if isinstance(store, GaugedStore) else QueueGauges()
    workers: tuple[WorkerInfo, ...] = ()
    if isinstance(store, JobQueue):
        workers = tuple(await store.list_workers(on_corrupt=_skip))
    return StoreReading(
        counts.jobs,
        counts.queue_due,
        counts.queue_scheduled,
        counts.leases_live,
        counts.leases_lapsed,
        workers,
    )


def _skip(exc: CorruptRecord) -> None:
    log.debug("metrics: skipped %s", exc)


# -- the collector ----------------------------------------------------------------------------


class StoreCollector(Collector):
    """Store gauges for a ``CollectorRegistry``, read at scrape time, cached and bounded.

    ``loop`` is the event loop the store's calls run on (the scrape runs on the metrics
    server's thread). At most one read is in flight: a scrape that finds one waits for it
    (at most ``timeout``) instead of starting another.
    """

    def __init__(
        self,
        store: object,
        loop: asyncio.AbstractEventLoop,
        *,
        ttl: float = 5.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.loop, self.ttl, self.timeout = store, loop, ttl, timeout
        self._clock = clock
        self._lock = threading.RLock()  # a done callback may run inside _start
        self._reading: StoreReading | None = None
        self._read_at = -float("inf")
        self._read_s = 0.0
        self._up = False
        self._pending: concurrent.futures.Future[tuple[StoreReading, float]] | None = None

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (so the registry knows the names)."""
        for name, doc in STORE_GAUGES.items():
            yield GaugeMetricFamily(name, doc, labels=_LABELS.get(name))

    def collect(self) -> Iterator[Metric]:
        self._refresh()
        with self._lock:
            reading, up, age = self._reading, self._up, self._clock() - self._read_at
            took = self._read_s
        yield from _families(reading, up, age, took)

    def _refresh(self) -> None:
        """Read the store unless the last reading is young; never wait past ``timeout``."""
        with self._lock:
            if self._up and self._clock() - self._read_at < self.ttl:
                return
            if self.loop.is_closed():  # the store is gone with it
                self._up = False
                return
            if self._pending is None or self._pending.done():  # done: already kept
                self._pending = self._start()
            pending = self._pending
        if _on_loop(self.loop):  # a scrape on the store's own loop cannot wait for it
            return
        try:
            reading, took = pending.result(timeout=self.timeout)
        except Exception as exc:  # a scrape never fails: the last values, and store_up 0
            log.debug("metrics: the store did not answer: %r", exc)
            with self._lock:
                self._up = False
            return
        self._keep(reading, took)

    def _start(self) -> concurrent.futures.Future[tuple[StoreReading, float]]:
        future = asyncio.run_coroutine_threadsafe(self._read(), self.loop)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future[tuple[StoreReading, float]]) -> None:
        with self._lock:
            if self._pending is future:
                self._pending = None
            if future.cancelled() or future.exception() is not None:
                self._up = False
                return
            self._keep(*future.result())

    def _keep(self, reading: StoreReading, took: float) -> None:
        with self._lock:
            self._reading, self._read_s = reading, took
            self._read_at, self._up = self._clock(), True

    async def _read(self) -> tuple[StoreReading, float]:
        started = time.perf_counter()
        async with asyncio.timeout(self.timeout):
            reading = await read_store(self.store)
        return reading, time.perf_counter() - started


def watch_store(
    registry: CollectorRegistry, store: object, *, ttl: float = 5.0, timeout: float = 2.0
) -> StoreCollector:
    """Register store gauges for ``store`` on ``registry``; call it on the store's event
    loop. ``registry.unregister(collector)`` before the store closes."""
    collector = StoreCollector(store, asyncio.get_running_loop(), ttl=ttl, timeout=timeout)
    registry.register(collector)
    return collector


_LABELS = {"jobs": ["status"], "worker_running_jobs": ["worker"], "worker_concurrency": ["worker"]}


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    with contextlib.suppress(RuntimeError):
        return asyncio.get_running_loop() is loop
    return False


def _families(
    reading: StoreReading | None, up: bool, age: float, took: float
) -> Iterator[GaugeMetricFamily]:
    yield GaugeMetricFamily("store_up", STORE_GAUGES["store_up"], value=1.0 if up else 0.0)
    if reading is None:
        return
    yield _gauge("store_read_age_seconds", age)
    yield _gauge("store_read_seconds", took)
    if reading.jobs is not None:
        jobs = GaugeMetricFamily("jobs", STORE_GAUGES["jobs"], labels=["status"])
        for status, n in reading.jobs.items():
            jobs.add_metric([status], n)
        yield jobs
    for name in ("queue_due", "queue_scheduled", "leases_live", "leases_lapsed"):
        value = getattr(reading, name)
        if value is not None:
            yield _gauge(name, value)
    yield from _worker_families(reading.workers)


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, STORE_GAUGES[name], value=value)


def _worker_families(workers: tuple[WorkerInfo, ...]) -> Iterator[GaugeMetricFamily]:
    """One series per live worker, the first :data:`MAX_LABEL_VALUES` by id; the rest
    summed as ``other``."""
    running: dict[str, int] = {}
    concurrency: dict[str, int] = {}
    for info in sorted(workers, key=lambda w: w.worker_id):
        name = redact(info.worker_id) if len(running) < MAX_LABEL_VALUES else OTHER
        running[name] = running.get(name, 0) + info.running
        concurrency[name] = concurrency.get(name, 0) + info.concurrency
    for metric, values in (("worker_running_jobs", running), ("worker_concurrency", concurrency)):
        family = GaugeMetricFamily(metric, STORE_GAUGES[metric], labels=["worker"])
        for worker, n in values.items():
            family.add_metric([worker], n)
        yield family
