"""The blocking facade, for code that is not async: :class:`SyncClient` runs a
:class:`~ai_lease.client.Client` on an event loop of its own, in a thread, and every method
waits for the answer; :func:`run_sync` runs one job. Neither may be called on a running
event loop, which it would block: that is refused, saying what to use instead.

>>> with ai_lease.SyncClient.connect("sqlite:///jobs.db") as client:   # doctest: +SKIP
...     print(client.run(Job("report-42", input="…")).output)
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from ai_lease.client import Client, connect
from ai_lease.errors import StoreDataLost
from ai_lease.job import Job, JobState
from ai_lease.lease.admin import TERMINAL_STATUSES, Removal
from ai_lease.lease.base import JobPage, LeaseStore
from ai_lease.lease.queue import WorkerInfo
from ai_lease.lease.timeline import TimelineEntry

__all__ = ["SyncClient", "run_sync"]

T = TypeVar("T")


class SyncClient:
    """A blocking :class:`Client` for code that is not async: it runs its own event loop in
    a thread, and every method waits for the answer.

    >>> with ai_lease.SyncClient.connect("sqlite:///jobs.db") as client:   # doctest: +SKIP
    ...     print(client.run(Job("report-42", input="…")).output)

    Methods: those of :class:`Client` (``run``, ``submit``, ``status``, ``result``,
    ``cancel``, ``retry``, ``remove``, ``prune``, ``list``, ``jobs``, ``counts``, ``events``,
    ``workers``, ``durations``, ``migrate``), blocking. :meth:`open` is
    :meth:`Client.open`'s client (it looks and tidies, runs nothing).
    """

    def __init__(self, opener: Callable[[], Client]) -> None:
        _refuse_inside_a_loop("SyncClient.connect()")
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="ai-lease sync client", daemon=True
        )
        self._thread.start()
        try:
            self._client = self._call(_opened(opener))
        except BaseException:
            self._stop()
            raise

    @classmethod
    def connect(cls, store: str | LeaseStore, **options: Any) -> SyncClient:
        """Like :func:`connect` (same arguments), blocking."""
        return cls(lambda: connect(store, **options))

    @classmethod
    def open(cls, url: str, **options: Any) -> SyncClient:
        """Like :meth:`Client.open` (same arguments: a client that looks and tidies), blocking."""
        return cls(lambda: Client.open(url, **options))

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            if self._closed:
                raise RuntimeError("this SyncClient is closed: open another with connect()")
            if threading.current_thread() is self._thread:
                raise RuntimeError("a SyncClient method was called from its own event loop")
            _refuse_inside_a_loop("a SyncClient method")
        except RuntimeError:
            work.close()  # never started: no "coroutine was never awaited" warning
            raise
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result()
        except KeyboardInterrupt:  # Ctrl-C: cancel the work (an owner steps down), then go
            future.cancel()
            concurrent.futures.wait([future], timeout=10)
            raise

    @property
    def client(self) -> Client:
        """The async client underneath (use it only on this client's loop)."""
        return self._client

    def run(self, job: Job) -> JobState:
        return self._call(self._client.run(job))

    def submit(self, job: Job) -> JobState:
        return self._call(self._client.submit(job))

    def status(self, key: str) -> JobState | None:
        return self._call(self._client.status(key))

    def result(self, key: str, *, timeout: float | None = None) -> Any:
        return self._call(self._client.result(key, timeout=timeout))

    def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        return self._call(self._client.cancel(key, reason))

    def retry(self, key: str) -> JobState | None:
        return self._call(self._client.retry(key))

    def remove(self, key: str, *, force: bool = False, reason: str = "removed") -> Removal:
        return self._call(self._client.remove(key, force=force, reason=reason))

    def prune(self, older_than: float, statuses: Iterable[str] = TERMINAL_STATUSES) -> int:
        return self._call(self._client.prune(older_than, statuses))

    def jobs(self, **filters: Any) -> JobPage:
        return self._call(self._client.jobs(**filters))

    def list(self, **filters: Any) -> builtins.list[JobState]:
        return self._call(self._client.list(**filters))

    def counts(self) -> dict[str, int]:
        return self._call(self._client.counts())

    def events(self, key: str, **options: Any) -> tuple[builtins.list[TimelineEntry], int]:
        return self._call(self._client.events(key, **options))

    def workers(self, **options: Any) -> builtins.list[WorkerInfo]:
        return self._call(self._client.workers(**options))

    def durations(self, **options: Any) -> dict[Any, dict[int, int]]:
        return self._call(self._client.durations(**options))

    def migrate(self) -> tuple[bool, int]:
        return self._call(self._client.migrate())

    def serves(self, side: type) -> bool:
        return self._client.serves(side)

    def data_lost(self) -> StoreDataLost | None:
        return self._call(self._client.data_lost())

    def close(self) -> None:
        """Close the client (what it opened) and stop its loop and thread; safe to call
        twice. A closed SyncClient refuses every method, and ``with`` again."""
        if self._closed or not self._loop.is_running():
            return
        try:
            self._call(self._client.aclose())
        finally:
            self._stop()
            self._closed = True

    def _stop(self) -> None:
        # The loop's default executor (asyncio.to_thread, e.g. a store's close) keeps its
        # threads until shut down: join them, so closing leaves no thread behind.
        with contextlib.suppress(Exception):
            self._call(self._loop.shutdown_default_executor())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
        if self._closed:
            raise RuntimeError("a closed SyncClient cannot be entered again: open another")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def _opened(opener: Callable[[], Client]) -> Client:
    return opener()  # built on the loop it will run on


def run_sync(job: Job, store: str | LeaseStore, **options: Any) -> JobState:
    """Run one job from code that is not async; return its DONE record (blocking).

    >>> record = ai_lease.run_sync(Job("report-42", input="…"),
    ...                            store="sqlite:///.ai-lease/jobs.db")  # doctest: +SKIP

    ``options`` are :func:`connect`'s. Inside a running event loop use ``await client.run``.
    """
    _refuse_inside_a_loop("ai_lease.run_sync()")
    return asyncio.run(_run_once(job, store, options))


def _refuse_inside_a_loop(what: str) -> None:
    """A blocking call made on a running event loop would stop that loop until it returned:
    refused, saying what to use instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} was called inside a running event loop, which it would block: "
        "use 'async with ai_lease.connect(...) as client: await client.run(job)'"
    )


async def _run_once(job: Job, store: str | LeaseStore, options: Mapping[str, Any]) -> JobState:
    async with connect(store, **options) as client:
        return await client.run(job)
