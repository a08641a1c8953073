"""The front door: one object that runs, submits, watches and cancels jobs.

>>> async with ai_lease.connect("sqlite:///.ai-lease/jobs.db") as client:   # doctest: +SKIP
...     record = await client.run(Job("report-42", input="Long text…"))
...     print(record.output)

:func:`connect` takes a store URL (``sqlite:///…``, ``redis://…``, ``rediss://…``,
``redis+cluster://…``) or a store object, a provider name or object (default the offline
``local-extractive``), and the run configuration as one value (:class:`RunConfig`: its
:class:`LeaseTimings`, :class:`RetryPolicy`, :class:`StreamTimeouts`, :class:`AdaptiveBudgets`
…; ``timings=`` and ``retry=`` are short for the first two). It never reads the
environment or a config file: settings are the CLI's business. Leaving the block closes what
``connect`` opened — never an object the caller passed in — also when the body raised.

For code that is not async, :class:`~ai_lease.sync_client.SyncClient` (or
:func:`~ai_lease.sync_client.run_sync` for one job) runs the same client on an event loop of
its own, in a thread.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from ai_lease.client_parts import (
    StoreSides,
    admin_of,
    close_all,
    listing_of,
    queue_of,
    timeline_of,
)
from ai_lease.errors import ConfigError, CorruptRecord, InputError, JobCancelled, JobFailed
from ai_lease.job import Job, JobState, Status, validate_key
from ai_lease.lease.admin import TERMINAL_STATUSES, Removal
from ai_lease.lease.base import JobPage, LeaseStore, require_store
from ai_lease.lease.histogram import DurationHistory
from ai_lease.lease.queue import WorkerInfo
from ai_lease.lease.timeline import TIMELINE_CAP, TimelineEntry
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import LeaseTimings, RetryPolicy

if TYPE_CHECKING:  # imported where used: a client that only looks (ai-lease ls) skips them
    from collections.abc import Callable

    from ai_lease.job_provider import ProviderChoice
    from ai_lease.lease.events import EventSink
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers import Provider
    from ai_lease.run.config import RunConfig
    from ai_lease.run.context import PersistHook
    from ai_lease.run.job_lease import JobLease
    from ai_lease.run.pipeline import Pipeline
    from ai_lease.run.provider_pick import ProviderResolver
    from ai_lease.run.runner import Runner
    from ai_lease.run.worker import Worker

__all__ = ["Client", "connect"]

T = TypeVar("T")


class Client(StoreSides, AsyncResource):
    """Jobs on one store with one provider. Build it with :func:`connect`.

    ``run(job)`` runs a job here (or follows whoever runs it) and returns its DONE record;
    ``submit(job)`` records it for workers; ``status(key)`` reads its record; ``result(key)``
    waits for its value; ``cancel(key)`` cancels it; ``retry(key)``, ``remove(key)`` and
    ``prune(older_than)`` tidy up finished ones; ``jobs()``, ``counts()``, ``events(key)``
    and ``workers()`` look (what ``ai-lease ls``, ``events`` and ``workers`` show);
    ``worker()`` makes a worker; ``lease(key)`` holds a job's lease around your own code
    (:class:`JobLease`); and ``slot(limit, capacity=N)`` one of a provider limit's slots,
    shared by every process on the store (:class:`SlotHold`). ``Client(store)`` with no
    runner (or :meth:`open`) only looks and tidies (and holds slots): ``run``, ``submit``,
    ``worker`` and ``lease`` need :func:`connect`'s runner.
    """

    def __init__(
        self,
        store: LeaseStore,
        runner: Runner | None = None,
        *,
        closes: tuple[Any, ...] = (),
    ) -> None:
        self.store, self._runner = store, runner
        self.provider = runner.provider if runner is not None else None
        self._closes = closes  # what connect() opened, closed in this order by aclose()
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        *,
        namespace: str = "ai_lease",
        op_timeout: float = LeaseTimings.op_timeout,
        poll_interval: float = 0.05,
        create: bool = True,
    ) -> Client:
        """A client that looks and tidies (no runner) on the store at ``url``, closed with
        it; ``create=False`` never makes a store (a missing one is :class:`StoreMissing`)."""
        from ai_lease.stores.urls import open_store

        store = open_store(
            url,
            namespace=namespace,
            op_timeout=op_timeout,
            poll_interval=poll_interval,
            create=create,
        )
        return cls(store, closes=(store,))

    @property
    def runner(self) -> Runner:
        """The runner :func:`connect` built (a :class:`ConfigError` on a client without)."""
        if self._runner is None:
            raise ConfigError(f"{self!r} only looks and tidies: open it with connect() to run jobs")
        return self._runner

    @property
    def timings(self) -> LeaseTimings:
        """The lease timings jobs run under (the defaults on a client without a runner)."""
        return self._runner.timings if self._runner is not None else LeaseTimings()

    # -- jobs -------------------------------------------------------------------------------

    async def run(self, job: Job) -> JobState:
        """Run ``job`` single-flight (see :meth:`Runner.run`); return its DONE record.

        Raises :class:`JobFailed` (:class:`JobCancelled` if it was cancelled)."""
        return await self._open().runner.run(job)

    async def submit(self, job: Job) -> JobState:
        """Record ``job`` for workers without running it here; return its record."""
        return await self._open().runner.submit(job)

    async def status(self, key: str) -> JobState | None:
        """Job ``key``'s record as the store holds it (None: no such job)."""
        return await self._open().store.get(validate_key(key))

    async def result(self, key: str, *, timeout: float | None = None) -> Any:
        """Wait until job ``key`` ends and return its result (decoded).

        Raises :class:`JobFailed` / :class:`JobCancelled` if it ended without one,
        :class:`InputError` for an unknown key, ``TimeoutError`` after ``timeout`` seconds."""
        poll = self._open().timings.poll_interval
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
                    raise JobFailed(key, record.last_error, record.ended_by)
                await self.store.wait(key, poll)

    async def cancel(self, key: str, reason: str = "cancelled") -> JobState | None:
        """Cancel job ``key``: a PENDING job never runs, a RUNNING one's owner stops within
        one renew interval (its renewal is refused, its commit rejected) and everyone
        waiting for it gets :class:`JobCancelled`. Returns the record — still DONE or
        FAILED if it had already ended — or None for an unknown key."""
        return await self._open().store.cancel(validate_key(key), reason)

    async def retry(self, key: str) -> JobState | None:
        """Send job ``key``, FAILED or CANCELLED, back to PENDING with a fresh attempt budget,
        due for workers at once. Any other job's record comes back unchanged (check its
        ``status``); None for an unknown key."""
        return await admin_of(self._open().store).retry(validate_key(key))

    async def remove(self, key: str, *, force: bool = False, reason: str = "removed") -> Removal:
        """Delete job ``key`` (record, queue entry, lease). A RUNNING job under a live lease
        is kept (``removed`` false) unless ``force``, which cancels it first (``reason``)."""
        store = self._open().store
        return await self.remove_from(store, validate_key(key), force=force, reason=reason)

    @staticmethod
    async def remove_from(
        store: LeaseStore, key: str, *, force: bool = False, reason: str = "removed"
    ) -> Removal:
        """:meth:`remove` on ``store`` (the one way a job is removed: ``ai-lease rm`` and the
        dashboard call it too); ``force`` cancels the job first, saying ``reason``."""
        if force:
            await store.cancel(key, reason)
        return await admin_of(store).remove(key, force=force)

    async def prune(self, older_than: float, statuses: Iterable[str] = TERMINAL_STATUSES) -> int:
        """Delete the DONE, FAILED and CANCELLED jobs (or only ``statuses``) last written more
        than ``older_than`` seconds ago; return how many."""
        wanted = frozenset(statuses)
        if unknown := wanted - TERMINAL_STATUSES:
            raise InputError(f"prune takes terminal statuses only, not {sorted(unknown)}")
        return await admin_of(self._open().store).prune(older_than, wanted)

    # -- looking --------------------------------------------------------------------------

    async def jobs(
        self,
        *,
        status: Status | str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        on_corrupt: Callable[[CorruptRecord], None] | None = None,
    ) -> JobPage:
        """One page of jobs, newest first, off the store's own indexes (``ai-lease ls``, the
        dashboard's list): of one ``status``, whose key starts with ``prefix``; pass
        ``after=page.next_cursor`` for the next page. ``limit`` is 1..500. A corrupt record
        is skipped, given to ``on_corrupt`` (without one, logged)."""
        wanted = status.value if isinstance(status, Status) else status
        return await listing_of(self._open().store).list_page(
            status=wanted, prefix=prefix, after=after, limit=limit, on_corrupt=on_corrupt
        )

    async def list(
        self,
        *,
        status: Status | str | None = None,
        limit: int = 100,
        on_corrupt: Callable[[CorruptRecord], None] | None = None,
    ) -> list[JobState]:
        """Up to ``limit`` jobs, newest first, of one ``status`` (what ``ai-lease ls`` reads);
        a corrupt record raises :class:`CorruptRecord`, or is skipped and given to
        ``on_corrupt``."""
        wanted = status.value if isinstance(status, Status) else status
        store = self._open().store
        return await store.list_jobs(status=wanted, limit=limit, on_corrupt=on_corrupt)

    async def counts(self) -> dict[str, int]:
        """How many jobs the store holds per status (statuses with none left out)."""
        return await listing_of(self._open().store).count_jobs()

    async def events(
        self, key: str, *, after_seq: int = 0, limit: int = TIMELINE_CAP
    ) -> tuple[builtins.list[TimelineEntry], int]:
        """Job ``key``'s timeline as the store wrote it (``ai-lease events``): up to
        ``limit`` entries after ``after_seq``, oldest first, and how many the cap dropped
        from the front."""
        return await timeline_of(self._open().store).timeline(
            validate_key(key), after_seq=after_seq, limit=limit
        )

    async def workers(
        self, *, on_corrupt: Callable[[CorruptRecord], None] | None = None
    ) -> builtins.list[WorkerInfo]:
        """The live workers as each last reported itself (``ai-lease workers``); a corrupt
        entry raises, or is skipped and given to ``on_corrupt``."""
        return await queue_of(self._open().store).list_workers(on_corrupt=on_corrupt)

    async def durations(
        self, *, on_corrupt: Callable[[CorruptRecord], None] | None = None
    ) -> dict[Any, dict[int, int]]:
        """The recorded stage and stream durations (``ai-lease tune`` reads them): histogram
        buckets per series; a corrupt series raises, or is skipped and given to ``on_corrupt``."""
        store = self._open().store
        if not isinstance(store, DurationHistory):
            raise ConfigError(f"{store!r} keeps no duration history")
        return dict(await store.load_durations(on_corrupt=on_corrupt))

    async def migrate(self) -> tuple[bool, int]:
        """Install or upgrade a PostgreSQL store's schema (``ai-lease migrate``): whether a
        migration was applied, and the schema's migration number."""
        store = self._open().store
        migrate = getattr(store, "migrate", None)
        if migrate is None:
            raise ConfigError(f"{store!r} needs no migration (only PostgreSQL does)")
        from ai_lease.stores.postgres.schema import VERSION

        return bool(await migrate()), VERSION

    def worker(self, *, concurrency: int = 4, **options: Any) -> Worker:
        """A :class:`Worker` on this client's store and runner: ``async with
        client.worker(concurrency=8):`` runs it until the block ends. ``options``:
        ``sweep_interval``, ``grace``, ``worker_id``, ``on_event``, ``isolation``,
        ``provider_factory``, ``terminate_grace``."""
        from ai_lease.run.worker import Worker

        return Worker(self._open().store, self.runner, concurrency=concurrency, **options)

    def with_runner(self, **options: Any) -> Client:
        """A client that runs jobs on this one's store (left open: this client closes it),
        from :func:`connect` with ``options``."""
        return connect(self._open().store, **options)

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
        from ai_lease.run.job_lease import JobLease, LeaseOptions

        runner = self._open().runner
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

    # -- opening and closing ----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._closed:
            raise RuntimeError(
                f"a closed client cannot be entered again ({self!r}): open another with connect()"
            )
        return self

    async def aclose(self) -> None:
        """Save recorded durations, then close what :func:`connect` opened (provider, store,
        providers built by ``provider_resolver``), each even if another failed; objects the
        caller passed in are left open."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._runner is not None:
                await self._runner.flush_history()
                await self._runner.aclose_providers()  # built for jobs' own provider choices
        finally:
            await close_all(self._closes)

    def __repr__(self) -> str:
        return f"<Client store={self.store!r} provider={getattr(self.provider, 'name', None)!r}>"


def connect(
    store: str | LeaseStore,
    *,
    provider: str | Provider | None = "local-extractive",
    provider_options: Mapping[str, Any] | None = None,
    config: RunConfig | None = None,
    timings: LeaseTimings | None = None,
    retry: RetryPolicy | None = None,
    prompts: PromptLibrary | None = None,
    pipeline: Pipeline | None = None,
    persist_hook: PersistHook | None = None,
    namespace: str = "ai_lease",
    on_event: EventSink | None = None,
    provider_resolver: ProviderResolver | None = None,
    provider_serves: ProviderChoice | None = None,
) -> Client:
    """The client for ``store`` (a URL or a store object) and ``provider`` (a name, built
    with ``provider_options``, or a provider object). Use it as ``async with``.

    ``config`` is the whole run configuration (:class:`RunConfig`: timings, retries,
    stream budgets and limits, stall policy, adaptive budgets, node id…); ``timings`` and
    ``retry`` are short for the two most often set, for a call without ``config`` (both at
    once is refused: say each value once). A job naming another provider than
    ``provider``'s name needs ``provider_resolver`` (a job's choice -> its provider's
    factory; :mod:`ai_lease.run.provider_pick`; ``provider_serves``: the choice ``provider``
    was built for). ``provider=None``: a client that records jobs for workers, runs none.

    >>> async with connect("redis://127.0.0.1:6379/0", provider="openai-compatible",
    ...                    provider_options={"base_url": "http://127.0.0.1:8080/v1"},
    ...                    config=RunConfig(timings=LeaseTimings(ttl=30, renew_interval=5),
    ...                                     adaptive=AdaptiveBudgets())) as client:
    ...     await client.run(Job("k", input="…"))                      # doctest: +SKIP
    """
    if not isinstance(store, str):
        store = require_store(store, "connect()", takes_url=True)
    config = _run_config(config, timings, retry)
    provider, opened = _provider(provider, provider_options)
    if isinstance(store, str):
        poll = min(0.05, config.timings.poll_interval)
        from ai_lease.stores.urls import open_store

        store = open_store(
            store, namespace=namespace, op_timeout=config.timings.op_timeout, poll_interval=poll
        )
        opened.append(store)
    from ai_lease.run.config import RunHooks
    from ai_lease.run.runner import Runner

    hooks = RunHooks(on_event=on_event, persist_hook=persist_hook)
    runner = Runner(
        store,
        provider=provider,
        pipeline=pipeline,
        prompts=prompts,
        config=config,
        hooks=hooks,
        provider_resolver=provider_resolver,
        provider_serves=provider_serves,
    )
    return Client(store, runner, closes=tuple(opened))


def _run_config(
    config: RunConfig | None, timings: LeaseTimings | None, retry: RetryPolicy | None
) -> RunConfig:
    """``config``, or one built from the short ``timings`` and ``retry``; both is refused."""
    from ai_lease.retry import JOB_ATTEMPTS
    from ai_lease.run.config import RunConfig

    if config is None:
        return RunConfig(timings=timings or LeaseTimings(), retry=retry or JOB_ATTEMPTS)
    if not isinstance(config, RunConfig):
        raise TypeError(f"connect(): config is a {type(config).__name__}, not a RunConfig")
    given = [name for name, value in (("timings", timings), ("retry", retry)) if value]
    if given:
        raise InputError(
            f"connect(): {' and '.join(given)} given beside config=: put "
            f"{' and '.join(given)} inside the RunConfig (RunConfig({given[0]}=…))"
        )
    return config


def _provider(
    provider: str | Provider | None, options: Mapping[str, Any] | None
) -> tuple[Provider | None, list[Any]]:
    """The provider object, and a list of what was opened for it (closed before the store;
    opening does no I/O: nothing to undo if a later step fails)."""
    if isinstance(provider, str):
        from ai_lease.providers import create_provider

        created = create_provider(provider, **dict(options or {}))
        return created, [created]
    if options:
        raise InputError("connect(): provider_options go with a provider name, not an object")
    return provider, []
