"""The front door: one object that runs, submits, watches and cancels jobs.

>>> async with ai_lease.connect("sqlite:///.ai-lease/jobs.db") as client:   # doctest: +SKIP
...     record = await client.run(Job("report-42", input="Long text…"))
...     print(record.output)

:func:`connect` takes a store URL (``sqlite:///…``, ``redis://…``, ``rediss://…``,
``redis+cluster://…``) or a store object, a provider name or object (default the offline
``local-extractive``), and plain value objects (:class:`LeaseTimings`, :class:`RetryPolicy`,
:class:`StreamTimeouts` …). It never reads the environment or a config file: settings are
the CLI's business. Leaving the block closes what ``connect`` opened — never an object the
caller passed in — also when the body raised.

For code that is not async, :meth:`Client.sync` (or :func:`run_sync` for one job) runs
the same client on an event loop of its own, in a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from ai_lease.errors import ConfigError, InputError, JobCancelled, JobFailed
from ai_lease.job import Job, JobState, Status, validate_key
from ai_lease.lease.base import TERMINAL_STATUSES, JobAdmin, LeaseStore, Removal
from ai_lease.lease.handle import JobLease, LeaseOptions
from ai_lease.lease.urls import open_store
from ai_lease.observe.events import EventSink
from ai_lease.prompts import PromptLibrary
from ai_lease.providers import Provider, create_provider
from ai_lease.resource import AsyncResource
from ai_lease.retry import JOB_ATTEMPTS, MODEL_CALL
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import PersistHook
from ai_lease.run.pipeline import Pipeline
from ai_lease.run.provider_pick import ProviderResolver
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.timeouts import LeaseTimings, RetryPolicy, StallPolicy, StreamLimits, StreamTimeouts

__all__ = ["Client", "SyncClient", "connect", "run_sync"]

T = TypeVar("T")


class Client(AsyncResource):
    """Jobs on one store with one provider. Build it with :func:`connect`.

    ``run(job)`` runs a job here (or follows whoever runs it) and returns its DONE record;
    ``submit(job)`` records it for workers; ``status(key)`` reads its record; ``result(key)``
    waits for its value; ``cancel(key)`` cancels it; ``retry(key)``, ``remove(key)`` and
    ``prune(older_than)`` tidy up finished ones; ``worker()`` makes a worker; and
    ``lease(key)`` holds a job's lease around your own code (:class:`JobLease`).
    """

    def __init__(
        self,
        store: LeaseStore,
        runner: Runner,
        *,
        closes: tuple[Any, ...] = (),
    ) -> None:
        self.store, self.runner = store, runner
        self.provider = runner.provider
        self._closes = closes  # what connect() opened, closed in this order by aclose()
        self._closed = False

    # -- jobs -------------------------------------------------------------------------------

    async def run(self, job: Job) -> JobState:
        """Run ``job`` single-flight (see :meth:`Runner.run`); return its DONE record.

        Raises :class:`JobFailed` (:class:`JobCancelled` if it was cancelled)."""
        return await self.runner.run(job)

    async def submit(self, job: Job) -> JobState:
        """Record ``job`` for workers without running it here; return its record."""
        return await self.runner.submit(job)

    async def status(self, key: str) -> JobState | None:
        """Job ``key``'s record as the store holds it (None: no such job)."""
        return await self.store.get(validate_key(key))

    async def result(self, key: str, *, timeout: float | None = None) -> Any:
        """Wait until job ``key`` ends and return its result (decoded).

        Raises :class:`JobFailed` / :class:`JobCancelled` if it ended without one,
        :class:`InputError` for an unknown key, ``TimeoutError`` after ``timeout`` seconds."""
        poll = self.runner.timings.poll_interval
        async with asyncio.timeout(timeout):
            while True:
                record = await self.store.get(validate_key(key))
                if record is None:
                    raise InputError(f"no job {key!r} in {self.store!r}: submit it first")
                if record.status is Status.DONE:
                    return record.output
                if record.status is Status.CANCELLED:
                    raise JobCancelled(key, record.last_error)
                if record.status is Status.FAILED:
                    raise JobFailed(key, record.last_error)
                await self.store.wait(key, poll)

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        """Cancel job ``key``: a PENDING job never runs, a RUNNING one's owner stops within
        one renew interval (its renewal is refused, its commit rejected) and everyone
        waiting for it gets :class:`JobCancelled`. Returns the record — still DONE or
        FAILED if it had already ended — or None for an unknown key."""
        return await self.store.cancel(validate_key(key), reason)

    async def retry(self, key: str) -> JobState | None:
        """Send job ``key``, FAILED or CANCELLED, back to PENDING with a fresh attempt budget,
        due for workers at once. Any other job's record comes back unchanged (check its
        ``status``); None for an unknown key."""
        return await self._admin().retry(validate_key(key))

    async def remove(self, key: str, *, force: bool = False) -> Removal:
        """Delete job ``key`` (record, queue entry, lease). A RUNNING job under a live lease
        is kept (``removed`` false) unless ``force``, which cancels it first."""
        return await self.remove_from(self.store, validate_key(key), force=force)

    @staticmethod
    async def remove_from(
        store: LeaseStore, key: str, *, force: bool = False, reason: str = "removed"
    ) -> Removal:
        """:meth:`remove` on ``store`` (the one way a job is removed: ``ai-lease rm`` and the
        dashboard call it too); ``force`` cancels the job first, saying ``reason``."""
        if force:
            await store.cancel(key, reason)
        return await _admin_of(store).remove(key, force=force)

    async def prune(self, older_than: float, statuses: Iterable[str] = TERMINAL_STATUSES) -> int:
        """Delete the DONE, FAILED and CANCELLED jobs (or only ``statuses``) last written more
        than ``older_than`` seconds ago; return how many."""
        wanted = frozenset(statuses)
        if unknown := wanted - TERMINAL_STATUSES:
            raise InputError(f"prune takes terminal statuses only, not {sorted(unknown)}")
        return await self._admin().prune(older_than, wanted)

    def _admin(self) -> JobAdmin:
        return _admin_of(self.store)

    def worker(self, *, concurrency: int = 4, **options: Any) -> Worker:
        """A :class:`Worker` on this client's store and runner: ``async with
        client.worker(concurrency=8):`` runs it until the block ends. ``options``:
        ``sweep_interval``, ``grace``, ``worker_id``, ``on_event``."""
        return Worker(self.store, self.runner, concurrency=concurrency, **options)

    def lease(
        self, key: str, *, stage: str = "load", max_no_progress: float | None = None
    ) -> JobLease:
        """Hold job ``key``'s lease around your own code (see :class:`JobLease`)::

        async with client.lease("nightly-report", stage="load") as job:
            ...
            job.progress(batch_no)
            job.stage("call_ai", max_no_progress=90)
            ...
            await job.commit(value)
        """
        runner = self.runner
        options = LeaseOptions(
            runner.timings, runner.retry, runner.stall_policy, runner.hooks.on_event
        )
        owner = runner.new_owner_id()
        return JobLease(
            self.store,
            validate_key(key),
            owner,
            options,
            stage=stage,
            max_no_progress=max_no_progress,
        )

    # -- closing ----------------------------------------------------------------------------

    @classmethod
    def sync(cls, store: str | LeaseStore, **options: Any) -> SyncClient:
        """A blocking client for code that is not async (:class:`SyncClient`); the same
        arguments as :func:`connect`: ``with Client.sync("sqlite:///jobs.db") as client:``."""
        return SyncClient.connect(store, **options)

    async def aclose(self) -> None:
        """Save recorded durations, then close what :func:`connect` opened (provider, store,
        providers built by ``provider_resolver``), each even if another failed; objects the
        caller passed in are left open."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.runner.flush_history()
            await self.runner.aclose_providers()  # built for jobs' own provider choices
        finally:
            await _close_all(self._closes)

    def __repr__(self) -> str:
        return f"<Client store={self.store!r} provider={getattr(self.provider, 'name', None)!r}>"


def _admin_of(store: LeaseStore) -> JobAdmin:
    """``store``'s :class:`JobAdmin` side, or a :class:`ConfigError` saying it has none."""
    if not isinstance(store, JobAdmin):
        raise ConfigError(f"{store!r} cannot retry, remove or prune jobs")
    return store


async def _close_all(resources: tuple[Any, ...]) -> None:
    """``aclose()`` each, in order; the first error is raised after all were tried."""
    first: BaseException | None = None
    for resource in resources:
        try:
            await resource.aclose()
        except Exception as exc:
            first = first or exc
    if first is not None:
        raise first


def connect(
    store: str | LeaseStore,
    *,
    provider: str | Provider = "local-extractive",
    provider_options: Mapping[str, Any] | None = None,
    timings: LeaseTimings | None = None,
    retry: RetryPolicy | None = None,
    stream_timeouts: StreamTimeouts | None = None,
    stream_limits: StreamLimits | None = None,
    call_retry: RetryPolicy | None = None,
    stall_policy: StallPolicy | None = None,
    prompts: PromptLibrary | None = None,
    pipeline: Pipeline | None = None,
    persist_hook: PersistHook | None = None,
    namespace: str = "ai_lease",
    node_id: str | None = None,
    on_event: EventSink | None = None,
    provider_resolver: ProviderResolver | None = None,
) -> Client:
    """The client for ``store`` (a URL or a store object) and ``provider`` (a name, built
    with ``provider_options``, or a provider object). Use it as ``async with``.

    A job naming another provider than ``provider``'s name needs ``provider_resolver``
    (a job's choice -> its provider's factory; :mod:`ai_lease.run.provider_pick`).

    >>> async with connect("redis://127.0.0.1:6379/0", provider="openai-compatible",
    ...                    provider_options={"base_url": "http://127.0.0.1:8080/v1"},
    ...                    timings=LeaseTimings(ttl=30, renew_interval=5)) as client:
    ...     await client.run(Job("k", input="…"))                      # doctest: +SKIP
    """
    timings = timings or LeaseTimings()
    provider, opened = _provider(provider, provider_options)
    if isinstance(store, str):
        poll = min(0.05, timings.poll_interval)
        store = open_store(
            store, namespace=namespace, op_timeout=timings.op_timeout, poll_interval=poll
        )
        opened.append(store)
    config = RunConfig(
        timings=timings,
        retry=retry or JOB_ATTEMPTS,
        stream_timeouts=stream_timeouts or StreamTimeouts(),
        stream_limits=stream_limits or StreamLimits(),
        call_retry=call_retry or MODEL_CALL,
        stall_policy=stall_policy,
        node_id=node_id,
    )
    hooks = RunHooks(on_event=on_event, persist_hook=persist_hook)
    runner = Runner(
        store,
        provider=provider,
        pipeline=pipeline,
        prompts=prompts,
        config=config,
        hooks=hooks,
        provider_resolver=provider_resolver,
    )
    return Client(store, runner, closes=tuple(opened))


def _provider(
    provider: str | Provider, options: Mapping[str, Any] | None
) -> tuple[Provider, list[Any]]:
    """The provider object, and a list of what was opened for it (closed before the store;
    opening does no I/O: nothing to undo if a later step fails)."""
    if isinstance(provider, str):
        created = create_provider(provider, **dict(options or {}))
        return created, [created]
    if options:
        raise InputError("connect(): provider_options go with a provider name, not an object")
    return provider, []


class SyncClient:
    """A blocking :class:`Client` for code that is not async: it runs its own event loop in
    a thread, and every method waits for the answer.

    >>> with ai_lease.SyncClient.connect("sqlite:///jobs.db") as client:   # doctest: +SKIP
    ...     print(client.run(Job("report-42", input="…")).output)

    Methods: ``run``, ``submit``, ``status``, ``result``, ``cancel`` (as on :class:`Client`).
    """

    def __init__(self, opener: Callable[[], Client]) -> None:
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

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a SyncClient method was called from its own event loop")
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

    def remove(self, key: str, *, force: bool = False) -> Removal:
        return self._call(self._client.remove(key, force=force))

    def prune(self, older_than: float, statuses: Iterable[str] = TERMINAL_STATUSES) -> int:
        return self._call(self._client.prune(older_than, statuses))

    def close(self) -> None:
        """Close the client (what it opened) and stop its loop and thread."""
        if not self._loop.is_running():
            return
        try:
            self._call(self._client.aclose())
        finally:
            self._stop()

    def _stop(self) -> None:
        # The loop's default executor (asyncio.to_thread, e.g. a store's close) keeps its
        # threads until shut down: join them, so closing leaves no thread behind.
        with contextlib.suppress(Exception):
            self._call(self._loop.shutdown_default_executor())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Self:
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
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "ai_lease.run_sync() was called inside a running event loop: "
            "use 'async with ai_lease.connect(...) as client: await client.run(job)'"
        )
    return asyncio.run(_run_once(job, store, options))


async def _run_once(job: Job, store: str | LeaseStore, options: Mapping[str, Any]) -> JobState:
    async with connect(store, **options) as client:
        return await client.run(job)
