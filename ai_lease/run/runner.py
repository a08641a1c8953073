"""The single-flight runner: one owner runs the job, every other node gets its result.

``await Runner(store, provider=…).run(Job(key, …))``:

1. a stored result is returned at once (DONE), a FAILED job raises :class:`JobFailed`;
2. otherwise the runner competes for the lease. As **owner** it runs one attempt
   (:class:`~ai_lease.run.attempt.Attempt`: the pipeline with the lease keeper beside it;
   the keeper renews only while the job makes progress, and a lost lease or a stall
   cancels the work). As **follower** it waits for the owner's result, or for its lease
   to lapse, and competes again;
3. a failed attempt (timeout, provider error, crash) is released with its error and retried
   after an exponential backoff (1 s, 2 s, 4 s…: :data:`~ai_lease.retry.JOB_ATTEMPTS`); the
   store counts attempts across nodes and ends the job FAILED after the last one. Bad input
   (a missing template variable, a 401) fails at once. A job-level deadline, counted from
   the job's first acquisition on the store's clock, bounds everything: every accepted job
   ends DONE or FAILED (time waiting in the queue has its own, optional bound:
   ``queue_deadline``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from ai_lease.errors import (
    AiLeaseError,
    ConfigError,
    JobCancelled,
    JobDeadlineExceeded,
    JobFailed,
    StoreUnavailable,
)
from ai_lease.inputs import resolve_input
from ai_lease.job import Job, JobState, Status
from ai_lease.job_provider import ProviderChoice
from ai_lease.lease.base import Acquired, Fence, Finished, Following, LeaseStore, require_store
from ai_lease.lease.events import Event
from ai_lease.lease.fence import UnansweredCommits, default_node_id, new_owner_id
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.lease.histogram import DurationHistory
from ai_lease.lease.queue import JobQueue
from ai_lease.lease.slots import SlotStore
from ai_lease.observe.history import HistoryRecorder
from ai_lease.observe.tracing import tracing_sink
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import Provider
from ai_lease.retry import run_rounds
from ai_lease.run.attempt import Attempt
from ai_lease.run.budgets import BudgetLearner
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.emitter import Emitter
from ai_lease.run.outage import StoreOutage
from ai_lease.run.pipeline import Pipeline
from ai_lease.run.provider_pick import ProviderPicker, ProviderResolver
from ai_lease.timeouts import StallPolicy

__all__ = ["Runner"]


class _Contact:
    """Whether this run has heard from the store yet, and how many errors it forgave
    before that: a store never reached is a configuration problem (report it at once),
    unless the error may hide a request that landed (a lost reply), which is retried a
    few times first."""

    FIRST_CONTACT_RETRIES = 3

    def __init__(self) -> None:
        self.reached = False
        self.forgiven = 0

    def tolerate(self, exc: StoreUnavailable) -> bool:
        if self.reached:
            return True
        self.forgiven += 1
        return exc.maybe_applied and self.forgiven <= self.FIRST_CONTACT_RETRIES


class Runner:
    """Runs :class:`Job` s single-flight across every node that shares ``store``.

    >>> runner = Runner(open_store("sqlite:///.ai-lease/ai-lease.db"),
    ...                 provider=LocalExtractiveProvider(),
    ...                 config=RunConfig(node_id="api-1"))                # doctest: +SKIP
    >>> record = await runner.run(Job("report-42", input=text))      # doctest: +SKIP
    >>> record.output                                                # doctest: +SKIP
    'The summary…'

    ``config`` (:class:`RunConfig`) holds the values it runs under, ``hooks``
    (:class:`RunHooks`) what it calls back. ``config.node_id`` names this node in records
    and logs (default ``host:pid``); each attempt owns the job under
    ``<node_id>#<n>.<random>``, so two attempts never share a fence.

    A job whose spec names a provider (``Job.provider``) runs on the provider that
    ``provider_resolver`` builds for that choice; without a resolver, ``provider`` serves
    only jobs that name none, or the choice it was built for (``provider_serves``), or one
    it provably matches (its ``name``, ``model`` and ``base_url``, no headers), and any other
    fails at once saying why (:mod:`ai_lease.run.provider_pick`). Providers built from the
    resolver are closed by :meth:`aclose_providers` (a :class:`~ai_lease.run.worker.Worker`
    does it as it stops).
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        provider: Provider | None = None,
        pipeline: Pipeline | None = None,
        prompts: PromptLibrary | None = None,
        config: RunConfig | None = None,
        hooks: RunHooks | None = None,
        provider_resolver: ProviderResolver | None = None,
        provider_serves: ProviderChoice | None = None,
    ) -> None:
        store = require_store(store, "Runner()")
        config, hooks = config or RunConfig(), hooks or RunHooks()
        if config.limits and not isinstance(store, SlotStore):
            names = ", ".join(limit.name for limit in config.limits.limits)
            raise ConfigError(f"limits ({names}): {store!r} keeps no provider slots")
        self.store, self.provider, self.config, self.hooks = store, provider, config, hooks
        self.providers = ProviderPicker(provider_resolver, serves=provider_serves)
        self.pipeline = pipeline or Pipeline.default()
        self.prompts = prompts or PromptLibrary()
        self.timings = config.timings  # adaptive mode replaces it with learned budgets
        self.retry = config.retry
        self.stall_policy = StallPolicy(config.stall_policy or config.timings.stall_policy)
        self.node_id = config.node_id or default_node_id()
        self.commits = UnansweredCommits()
        # Jobs waiting through a store outage retry every poll interval: said once, counted.
        self.outage = StoreOutage(self._say_outage)
        # Stage durations go to the store's history (for `ai-lease tune` and adaptive
        # budgets); learned budgets replace the configured ones, which stay the ceiling.
        self.history = (
            HistoryRecorder(store, config.pipeline_name)
            if config.record_history and isinstance(store, DurationHistory)
            else None
        )
        learned_for = self.history.pipeline if self.history else "default"
        self.budgets = BudgetLearner(store, config.timings, config.adaptive, learned_for)
        self.tracing = tracing_sink() if config.trace else None
        self.events = Emitter(lambda: (self.history, self.tracing, self.hooks.on_event))

    # -- events --------------------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether any sink takes events (none: no Event is built at all)."""
        return self.events.listening

    @property
    def sink_failures(self) -> int:
        """Events a raising sink (``on_event``) failed to take."""
        return self.events.failures

    def emit(
        self,
        kind: str,
        key: str,
        fence: Fence | None = None,
        detail: str = "",
        stage: str | None = None,
        value: float | None = None,
    ) -> None:
        """Build and hand out one event, if anyone listens."""
        self.events.emit(kind, key, fence, detail, stage, value)

    def emit_event(self, event: Event) -> None:
        """Hand ``event`` to every sink. A sink that raises never breaks the job it
        observes: its first failure is logged, every failure counted (``sink_failures``)."""
        self.events.emit_event(event)

    def _say_outage(self, kind: str, key: str, detail: str, failures: int) -> None:
        self.emit(kind, key, detail=detail, value=float(failures))

    # -- the front ----------------------------------------------------------------------------

    async def run(self, job: Job) -> JobState:
        """Run ``job`` (or follow whoever runs it) until it is DONE; return its record.

        Raises :class:`JobFailed` when the job ends FAILED, :class:`JobConflict` when the key
        already names a job with another payload, :class:`JobDeadlineExceeded` past the
        job's total deadline.
        """
        record = await self._run(job, follow=True)
        assert record is not None
        return record

    async def try_run(self, job: Job) -> JobState | None:
        """Like :meth:`run`, but return None instead of following when another owner holds
        a live lease, or instead of waiting to compete again when our attempt lost its lease
        (what a worker wants: its slot is better spent on another job)."""
        return await self._run(job, follow=False)

    async def submit(self, job: Job) -> JobState:
        """Record ``job`` for workers (``ai-lease worker``) without running it here.

        The store must be a :class:`~ai_lease.lease.queue.JobQueue` (both built-ins are).
        """
        job = await self._read_input(job)
        await self.pipeline.preflight(job, self.prompts)
        if not isinstance(self.store, JobQueue):
            raise ConfigError(f"{self.store!r} keeps no job queue: workers cannot see jobs")
        return await self.store.submit(job.key, job.to_spec(), job.fingerprint())

    def provider_for(self, job: Job) -> Provider | None:
        """The provider that runs ``job`` here: the one its spec names, else this runner's
        own; raises :class:`~ai_lease.errors.JobSpecError` when this runner cannot give it."""
        return self.providers.pick(job.key, job.provider, self.provider)

    def using_provider(self, job: Job) -> contextlib.AbstractAsyncContextManager[Provider | None]:
        """:meth:`provider_for`, held while one attempt runs (a provider built for a job's
        choice is not closed to make room for another while it is in use)."""
        return self.providers.using(job.key, job.provider, self.provider)

    async def aclose_providers(self) -> None:
        """Close the providers built for jobs' choices (not ``provider``: yours to close)."""
        await self.providers.aclose()

    def new_owner_id(self) -> str:
        """A fresh owner id for one attempt on this node (see :func:`new_owner_id`)."""
        return new_owner_id(self.node_id)

    async def flush_history(self, *, force: bool = True) -> None:
        """Add the durations recorded so far to the store's history (best effort)."""
        if self.history is None:
            return
        try:
            await self.history.flush(force=force)
        except (StoreUnavailable, AiLeaseError) as exc:
            self.emit("store_unavailable", "", detail=f"history not saved: {exc}")

    async def _read_input(self, job: Job) -> Job:
        """The caller's ``input_file`` read here, on the submitting side (bounded)."""
        if job.input_file is None:
            return job
        return await asyncio.to_thread(resolve_input, job, self.config.max_input_bytes)

    async def _run(self, job: Job, *, follow: bool) -> JobState | None:
        job = await self._read_input(job)
        prepared = await self.pipeline.preflight(job, self.prompts)
        self.provider_for(job)  # a provider this node cannot give fails the job before it runs
        learned = await self.budgets.refresh(
            lambda exc: self.emit("store_corrupt", job.key, detail=str(exc))
        )
        if learned is not None:
            self.timings = learned
        try:
            rounds = _Rounds(self, job, follow, prepared)
            outcome = await run_rounds(rounds.next, rounds.pause)
            assert outcome is None or isinstance(outcome, JobState)
            return outcome
        finally:
            await self.flush_history(force=False)

    # -- what a round found -------------------------------------------------------------------

    def on_follow(self, following: Following) -> None:
        rec = following.job
        fence = Fence(rec.key, rec.owner_id or "?", rec.token)
        left = f"{rec.lease_remaining:.1f}s of lease left"
        self.emit("following", rec.key, fence, left, stage=rec.stage)

    def finished(self, record: JobState) -> JobState:
        """``record`` of a job that has ended: returned if DONE, else raised."""
        if record.status is Status.DONE:
            if self.commits.applied_late(record):
                fence = Fence.of(record)
                self.emit("commit_late", record.key, fence, "commit answer arrived late: applied")
            self.emit("done", record.key, detail="result stored")
            return record
        if record.status is Status.CANCELLED:
            self.emit("cancelled", record.key, detail=record.last_error or "")
            raise JobCancelled(record.key, record.last_error)
        if self.events.listening:
            kind = {"kind": record.failure_kind or ""}
            self.emit_event(Event("failed", record.key, detail=record.last_error or "", attrs=kind))
        raise JobFailed(record.key, record.last_error, record.ended_by)


class _Rounds:
    """The rounds of one run: compete for the job; as owner, make one attempt. A round
    returns the job's end (a record, or None: another owner holds it and we do not follow)
    or how long to pause before the next round (see :func:`~ai_lease.retry.run_rounds`)."""

    def __init__(self, runner: Runner, job: Job, follow: bool, prepared: Mapping[str, Any]) -> None:
        self.runner, self.job, self.follow, self.prepared = runner, job, follow, prepared
        self.started = time.monotonic()
        self.contact = _Contact()
        self.owner_id = runner.new_owner_id()
        self.follows = True  # whether the next pause follows the job (stands aside)
        self.found: JobState | None = None  # the job's end, seen while standing aside

    async def next(self) -> JobState | float | None:
        runner, timings = self.runner, self.runner.timings
        if self.found is not None:
            return runner.finished(self.found)
        left = timings.job_deadline - (time.monotonic() - self.started)
        try:
            async with asyncio.timeout(max(left, 0.0)):
                outcome, sent_at = await self._compete()
        except TimeoutError:
            raise JobDeadlineExceeded(self.job.key, timings.job_deadline) from None
        except StoreUnavailable as exc:
            if not self.contact.tolerate(exc):  # never reached: a configuration problem
                raise
            # Same owner id next time: if the lost acquire did land, the repeat returns
            # our own lease instead of making us follow it for a whole TTL.
            runner.outage.failed(self.job.key, exc)
            self.follows = False
            return timings.poll_interval
        self.contact.reached = True
        runner.outage.reached(self.job.key, sent_at)
        if outcome is None:
            return None
        if isinstance(outcome, Finished):
            return runner.finished(outcome.job)
        attempt = Attempt(runner, self.job, outcome, self.prepared, sent_at)
        ended = await attempt.run()
        self.owner_id = runner.new_owner_id()  # the next attempt gets a fence of its own
        self.follows = True
        if attempt.lease_gone and not self.follow:
            return None  # a worker's slot is freed now; the job's recovery look brings it back
        return ended

    async def pause(self, seconds: float) -> None:
        """Between rounds: follow only (stand aside), or after a store error just wait."""
        if not self.follows:
            await asyncio.sleep(seconds)
        elif seconds > 0:
            self.found = await self._stand_aside(seconds)

    async def _compete(self) -> tuple[Acquired | Finished | None, float]:
        """Acquire the job as ``owner_id``; meanwhile follow whoever holds it, or
        (``follow=False``) return None at once. Also returns when (monotonic clock) the
        last acquire was sent: a granted lease is valid for its TTL from then, not from
        the reply (which may have waited on a blocked event loop)."""
        runner, job, timings = self.runner, self.job, self.runner.timings
        sent = [time.monotonic()]

        def on_send() -> None:
            sent[0] = time.monotonic()

        kwargs: dict[str, Any] = dict(
            ttl=timings.ttl,
            max_no_progress=runner.pipeline.budgets(timings)[0].max_no_progress,
            stall_policy=runner.stall_policy.value,
            fingerprint=job.fingerprint(),
            max_attempts=runner.retry.attempts,
            renew_interval=timings.renew_interval,  # kept in the record, for its health
        )
        if not self.follow:
            outcome = await runner.store.acquire(job.key, self.owner_id, **kwargs)
            return (None if isinstance(outcome, Following) else outcome), sent[0]

        def on_follow(following: Following) -> None:
            self.contact.reached = True  # an answer: later store errors are blips
            runner.outage.reached(job.key, sent[0])
            runner.on_follow(following)

        owned = await acquire_or_follow(
            runner.store,
            job.key,
            self.owner_id,
            poll_interval=timings.poll_interval,
            on_follow=on_follow,
            on_send=on_send,
            **kwargs,
        )
        return owned, sent[0]

    async def _stand_aside(self, seconds: float) -> JobState | None:
        """Follow only, for ``seconds``: return the record if the job finishes meanwhile."""
        store, poll = self.runner.store, self.runner.timings.poll_interval
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while (left := until - loop.time()) > 0:
            try:
                record = await store.get(self.job.key)
                if record is not None and record.status.terminal:
                    return record
                await store.wait(self.job.key, min(left, poll))
            except StoreUnavailable:
                await asyncio.sleep(min(left, poll))
        return None
