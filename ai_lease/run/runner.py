"""The single-flight runner: one owner runs the job, every other node gets its result.

``await Runner(store, provider=…).run(Job(key, …))``:

1. a stored result is returned at once (DONE), a FAILED job raises :class:`JobFailed`;
2. otherwise the runner competes for the lease. As **owner** it runs the pipeline with the
   lease keeper beside it (the keeper's task starts when its first renewal is due): the
   keeper renews only while the job makes progress, and a lost lease or a stall cancels the
   work. As **follower** it waits
   for the owner's result, or for its lease to lapse, and competes again;
3. a failed attempt (timeout, provider error, crash) is released with its error and retried
   after an exponential backoff (1 s, 2 s, 4 s…); the store counts attempts across nodes and
   ends the job FAILED after the last one. Bad input (a missing template variable, a 401)
   fails at once. A job-level deadline, counted from the job's first acquisition on the
   store's clock, bounds everything: every accepted job ends DONE or FAILED (time waiting
   in the queue has its own, optional bound: ``queue_deadline``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from ai_lease.errors import (
    AiLeaseError,
    ConfigError,
    FencingRejected,
    InputError,
    JobCancelled,
    JobDeadlineExceeded,
    JobFailed,
    LeaseError,
    LeaseLost,
    ProviderError,
    Stalled,
    StoreUnavailable,
)
from ai_lease.inputs import DEFAULT_MAX_INPUT_BYTES, resolve_input
from ai_lease.job import Job, JobState, Status
from ai_lease.lease.base import Acquired, Fence, Finished, Following, JobQueue, LeaseStore, due_now
from ai_lease.lease.follow import acquire_or_follow
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.observe.events import Event, EventSink
from ai_lease.observe.history import DurationHistory, Histogram, HistoryRecorder
from ai_lease.observe.tracing import tracing_sink
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import Provider
from ai_lease.providers.retry import CALL_RETRY
from ai_lease.redaction import redact
from ai_lease.run.pipeline import PersistHook, Pipeline, StageContext
from ai_lease.run.progress import Progress
from ai_lease.testing.faults import FaultPlan
from ai_lease.timeouts import (
    AdaptiveBudgets,
    LeaseTimings,
    RetryPolicy,
    StageBudget,
    StallPolicy,
    StreamLimits,
    StreamTimeouts,
)

T = TypeVar("T")

__all__ = ["Runner"]

_attempts = itertools.count(1)
_log = logging.getLogger("ai_lease.runner")


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


def default_node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _describe(exc: BaseException) -> str:
    return redact(f"{type(exc).__name__}: {exc}")[:2000]


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ProviderError):
        return exc.retryable
    return not isinstance(exc, InputError)


class Runner:
    """Runs :class:`Job` s single-flight across every node that shares ``store``.

    >>> runner = Runner(open_store("sqlite:///.ai-lease/ai-lease.db"),
    ...                 provider=LocalExtractiveProvider())          # doctest: +SKIP
    >>> record = await runner.run(Job("report-42", input=text))      # doctest: +SKIP
    >>> record.output                                                # doctest: +SKIP
    'The summary…'

    ``node_id`` names this node in records and logs (default ``host:pid``); each attempt
    owns the job under ``<node_id>#<n>.<random>``, so two attempts never share a fence.
    """

    def __init__(
        self,
        store: LeaseStore,
        *,
        provider: Provider | None = None,
        pipeline: Pipeline | None = None,
        timings: LeaseTimings | None = None,
        retry: RetryPolicy | None = None,
        stream_timeouts: StreamTimeouts | None = None,
        stream_limits: StreamLimits | None = None,
        call_retry: RetryPolicy | None = None,
        stall_policy: StallPolicy | None = None,
        prompts: PromptLibrary | None = None,
        persist_hook: PersistHook | None = None,
        node_id: str | None = None,
        on_event: EventSink | None = None,
        record_history: bool = True,
        adaptive: AdaptiveBudgets | None = None,
        pipeline_name: str = "default",
        trace: bool = True,
        faults: FaultPlan | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
    ) -> None:
        self.store, self.provider = store, provider
        self.max_input_bytes = max_input_bytes
        self.pipeline = pipeline or Pipeline.default()
        self.timings = timings or LeaseTimings()
        self.retry = retry or RetryPolicy()
        self.stream_timeouts = stream_timeouts or StreamTimeouts()
        self.stream_limits = stream_limits or StreamLimits()
        self.call_retry = call_retry or CALL_RETRY
        self.stall_policy = StallPolicy(stall_policy or self.timings.stall_policy)
        self.prompts = prompts or PromptLibrary()
        self.persist_hook = persist_hook
        self.node_id = node_id or default_node_id()
        self._sink = on_event
        self.sink_failures = 0  # events a raising sink (``on_event``) failed to take
        # Fences of attempts that ended without their commit's answer: if the job turns
        # out DONE under one of them, that commit was applied after all (and is logged).
        self._unanswered: dict[Fence, None] = {}
        # Stage durations go to the store's history (for `ai-lease tune` and adaptive
        # budgets); learned budgets replace the configured ones, which stay the ceiling.
        self.history = (
            HistoryRecorder(store, pipeline_name)
            if record_history and isinstance(store, DurationHistory)
            else None
        )
        self.configured_timings, self.adaptive = self.timings, adaptive
        self.tracing = tracing_sink() if trace else None
        self.faults = faults  # tests only
        self._budgets_read_at = -math.inf

    @property
    def _listening(self) -> bool:
        """Whether any sink takes events (none: no Event is built at all)."""
        return self.history is not None or self.tracing is not None or self._sink is not None

    def _emit(
        self,
        kind: str,
        key: str,
        fence: Fence | None = None,
        detail: str = "",
        stage: str | None = None,
        value: float | None = None,
    ) -> None:
        if not self._listening:
            return
        owner, token = (fence.owner_id, fence.token) if fence else (None, None)
        self._emit_event(Event(kind, key, owner, token, stage, None, detail, value=value))

    # -- the loop ------------------------------------------------------------------------------

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
        a live lease (what a worker wants: its slot is better spent on another job)."""
        return await self._run(job, follow=False)

    async def submit(self, job: Job) -> JobState:
        """Record ``job`` for workers (``ai-lease worker``) without running it here.

        The store must be a :class:`~ai_lease.lease.base.JobQueue` (both built-ins are).
        """
        job = await self._read_input(job)
        await self.pipeline.preflight(job, self.prompts)
        if not isinstance(self.store, JobQueue):
            raise ConfigError(f"{self.store!r} keeps no job queue: workers cannot see jobs")
        return await self.store.submit(job.key, job.to_spec(), job.fingerprint())

    async def _read_input(self, job: Job) -> Job:
        """The caller's ``input_file`` read here, on the submitting side (bounded)."""
        if job.input_file is None:
            return job
        return await asyncio.to_thread(resolve_input, job, self.max_input_bytes)

    async def _run(self, job: Job, *, follow: bool) -> JobState | None:
        job = await self._read_input(job)
        prepared = await self.pipeline.preflight(job, self.prompts)
        await self._learn_budgets(job.key)
        try:
            return await self._loop(job, follow, prepared)
        finally:
            await self.flush_history(force=False)

    async def flush_history(self, *, force: bool = True) -> None:
        """Add the durations recorded so far to the store's history (best effort)."""
        if self.history is None:
            return
        try:
            await self.history.flush(force=force)
        except (StoreUnavailable, AiLeaseError) as exc:
            self._emit("store_unavailable", "", detail=f"history not saved: {exc}")

    async def _learn_budgets(self, key: str) -> None:
        """Adaptive mode: stage budgets from the recorded P99s (see AdaptiveBudgets); a
        corrupt histogram is skipped and reported, never a reason to fail the job."""
        adaptive = self.adaptive
        if adaptive is None or not isinstance(self.store, DurationHistory):
            return
        if time.monotonic() - self._budgets_read_at < adaptive.refresh_interval:
            return
        self._budgets_read_at = time.monotonic()
        try:
            histories = await self.store.load_durations(
                on_corrupt=lambda exc: self._emit("store_corrupt", key, detail=str(exc))
            )
        except StoreUnavailable:
            return
        self.timings = learned_timings(
            self.configured_timings,
            histories,
            adaptive,
            self.history.pipeline if self.history else "default",
        )

    async def _loop(self, job: Job, follow: bool, prepared: Mapping[str, Any]) -> JobState | None:
        started = time.monotonic()
        contact = _Contact()
        owner_id = self._new_owner_id()
        while True:
            left = self.timings.job_deadline - (time.monotonic() - started)
            try:
                async with asyncio.timeout(max(left, 0.0)):
                    outcome, sent_at = await self._compete(job, follow, owner_id, contact)
            except TimeoutError:
                raise JobDeadlineExceeded(job.key, self.timings.job_deadline) from None
            except StoreUnavailable as exc:
                if not contact.tolerate(exc):  # never reached: a configuration problem
                    raise
                # Same owner id next time: if the lost acquire did land, the repeat returns
                # our own lease instead of making us follow it for a whole TTL.
                self._emit("store_unavailable", job.key, detail=str(exc))
                await asyncio.sleep(self.timings.poll_interval)
                continue
            contact.reached = True
            if outcome is None:
                return None
            if isinstance(outcome, Finished):
                return self._finished(outcome.job)
            attempt = await self._attempt(job, outcome, prepared, sent_at)
            owner_id = self._new_owner_id()  # the next attempt gets a fence of its own
            if isinstance(attempt, JobState):
                return attempt
            finished = await self._stand_aside(job.key, attempt) if attempt > 0 else None
            if finished is not None:
                return self._finished(finished)

    def _new_owner_id(self) -> str:
        return f"{self.node_id}#{next(_attempts)}.{secrets.token_hex(2)}"

    async def _compete(
        self, job: Job, follow: bool, owner_id: str, contact: _Contact
    ) -> tuple[Acquired | Finished | None, float]:
        """Acquire the job as ``owner_id``; meanwhile follow whoever holds it, or
        (``follow=False``) return None at once. Also returns when (monotonic clock) the
        last acquire was sent: a granted lease is valid for its TTL from then, not from
        the reply (which may have waited on a blocked event loop)."""
        sent = [time.monotonic()]

        def on_send() -> None:
            sent[0] = time.monotonic()

        kwargs: dict[str, Any] = dict(
            ttl=self.timings.ttl,
            max_no_progress=self.pipeline.budgets(self.timings)[0].max_no_progress,
            stall_policy=self.stall_policy.value,
            fingerprint=job.fingerprint(),
            max_attempts=self.retry.attempts,
        )
        if follow:

            def on_follow(following: Following) -> None:
                contact.reached = True  # an answer: later store errors are blips
                self._on_follow(following)

            owned = await acquire_or_follow(
                self.store,
                job.key,
                owner_id,
                poll_interval=self.timings.poll_interval,
                on_follow=on_follow,
                on_send=on_send,
                **kwargs,
            )
            return owned, sent[0]
        outcome = await self.store.acquire(job.key, owner_id, **kwargs)
        return (None if isinstance(outcome, Following) else outcome), sent[0]

    def _on_follow(self, following: Following) -> None:
        rec = following.job
        fence = Fence(rec.key, rec.owner_id or "?", rec.token)
        self._emit(
            "following",
            rec.key,
            fence,
            f"{rec.lease_remaining:.1f}s of lease left",
            stage=rec.stage,
        )

    def _finished(self, record: JobState) -> JobState:
        if record.status is Status.DONE:
            fence = Fence.of(record)
            if self._unanswered.pop(fence, ()) is None:
                self._emit("commit_late", record.key, fence, "commit answer arrived late: applied")
            self._emit("done", record.key, detail="result stored")
            return record
        if record.status is Status.CANCELLED:
            self._emit("cancelled", record.key, detail=record.last_error or "")
            raise JobCancelled(record.key, record.last_error)
        self._emit("failed", record.key, detail=record.last_error or "")
        raise JobFailed(record.key, record.last_error)

    async def _attempt(
        self, job: Job, acquired: Acquired, prepared: Mapping[str, Any], sent_at: float
    ) -> JobState | float:
        """One attempt as owner. Returns the DONE record, or how long to stand aside
        (following only) before competing again."""
        fence, record = acquired.fence, acquired.job
        self._emit(
            "acquired",
            job.key,
            fence,
            f"attempt {record.attempts}" + (" (takeover)" if acquired.takeover else ""),
        )
        if acquired.takeover:
            self._emit("takeover", job.key, fence, f"previous attempts {record.attempts - 1}")
        # The job deadline runs from the first acquisition: queue time has its own bound.
        started = record.read_at if record.started_at is None else record.started_at
        left = self.timings.job_deadline - (record.read_at - started)
        backoff = self.retry.backoff(record.attempts)
        if started - record.created_at > self.timings.queue_deadline:
            reason = (
                f"job {job.key!r} waited {started - record.created_at:.1f}s in the queue, past "
                f"its queue deadline of {self.timings.queue_deadline:g}s (lease.queue_deadline)"
            )
            await self._fail(fence, reason)
            raise JobFailed(job.key, reason)
        self._unanswered[fence] = None  # until the attempt has its commit's answer
        if len(self._unanswered) > 1024:
            del self._unanswered[next(iter(self._unanswered))]
        try:
            committed = await self._own(job, acquired, left, prepared, sent_at)
            self._unanswered.pop(fence, None)
            return committed
        except asyncio.CancelledError:
            await self._step_down(fence)  # e.g. a worker shutting down: hand over at once
            raise
        except FencingRejected as exc:
            self._fenced(fence, exc)
            return 0.0  # someone else owns it now: follow them
        except Stalled as exc:
            # Our work was stuck: let the other nodes take over first, rather than racing
            # them for the lease we are letting lapse (a zombie should not win it back).
            self._emit("retry", job.key, fence, str(exc))
            lapse = self.timings.ttl if self.stall_policy is StallPolicy.EXPIRE else 0.0
            return lapse + 2 * self.timings.poll_interval + backoff
        except LeaseError as exc:
            self._emit("retry", job.key, fence, str(exc))
            return self.timings.poll_interval
        except JobDeadlineExceeded as exc:
            await self._fail(fence, _describe(exc))  # named like every other failure
            raise
        except Exception as exc:
            if not _retryable(exc):
                await self._fail(fence, _describe(exc))
                raise JobFailed(job.key, _describe(exc)) from exc
            await self._release(fence, _describe(exc))
            if record.attempts >= self.retry.attempts:
                return 0.0  # the next acquire ends the job FAILED with this error
            self._emit("retry", job.key, fence, f"{_describe(exc)}; retrying in {backoff:g}s")
            return backoff

    async def _stand_aside(self, key: str, seconds: float) -> JobState | None:
        """Follow only, for ``seconds``: return the record if the job finishes meanwhile."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while (left := until - loop.time()) > 0:
            try:
                record = await self.store.get(key)
                if record is not None and record.status.terminal:
                    return record
                await self.store.wait(key, min(left, self.timings.poll_interval))
            except StoreUnavailable:
                await asyncio.sleep(min(left, self.timings.poll_interval))
        return None

    async def _own(
        self,
        job: Job,
        acquired: Acquired,
        left: float,
        prepared: Mapping[str, Any],
        sent_at: float,
    ) -> JobState:
        fence = acquired.fence
        progress = Progress()
        started = progress.clock()
        keeper = LeaseKeeper(
            self.store,
            fence,
            progress,
            self.timings,
            # Counted from when the acquire was sent (the store granted it later): a loop
            # blocked after the reply cannot make us believe in a lease that has lapsed.
            valid_until=sent_at + acquired.job.lease_remaining,
            stall_policy=self.stall_policy,
            on_event=self._emit_event,
        )
        ctx = StageContext(
            job=job,
            fence=fence,
            store=self.store,
            tracker=progress,
            keeper=keeper,
            provider=self.provider,
            prompts=self.prompts,
            stream_timeouts=self.stream_timeouts,
            stream_limits=self.stream_limits,
            persist_hook=self.persist_hook,
            call_retry=self.call_retry,
            faults=self.faults,
            prepared=prepared,
        )
        deadline = asyncio.timeout(max(left, 0.0))
        try:
            async with deadline:
                emit = self._emit_event if self._listening else None
                value = await _alongside(self.pipeline.run(ctx, self.timings, emit), keeper)
        except TimeoutError:
            if deadline.expired():
                raise JobDeadlineExceeded(job.key, self.timings.job_deadline) from None
            raise
        committed = ctx.committed or await ctx.commit(value)
        if not self._listening:
            return committed
        self._emit_event(
            Event(
                "committed",
                job.key,
                fence.owner_id,
                fence.token,
                progress.stage,
                progress.idle(),
                "one result stored",
                value=progress.clock() - started,
                attrs={"progress": progress.version - keeper.reported_version},
            )
        )
        return committed

    def _emit_event(self, event: Event) -> None:
        """Hand ``event`` to every sink. A sink that raises never breaks the job it
        observes: its first failure is logged, every failure counted (``sink_failures``)."""
        for sink in (self.history, self.tracing, self._sink):
            if sink is None:
                continue
            try:
                sink(event)
            except Exception:
                self.sink_failures += 1
                if self.sink_failures == 1:
                    _log.exception(
                        "event sink %r failed on a %r event (logged once; the job goes on)",
                        sink,
                        event.kind,
                    )

    def _fenced(self, fence: Fence, exc: FencingRejected) -> None:
        reason = exc.code
        self._emit_event(
            Event(
                "fenced",
                fence.key,
                fence.owner_id,
                fence.token,
                None,
                None,
                str(exc),
                attrs={"reason": reason},
            )
        )

    async def _step_down(self, fence: Fence) -> None:
        """Release after a cancellation (Ctrl-C, a shutdown), bounded by the store's op
        timeout. An interrupt is not the job's failure: the attempt is handed back."""
        try:
            async with asyncio.timeout(self.timings.op_timeout * 2):
                await self.store.release(fence, interrupted=True)
                await due_now(self.store, fence.key)
            if self._listening:
                self._emit_event(
                    Event(
                        "released",
                        fence.key,
                        fence.owner_id,
                        fence.token,
                        detail="cancelled: stepped down",
                        attrs={"reason": "interrupted"},
                    )
                )
        except (StoreUnavailable, TimeoutError) as exc:
            self._emit("store_unavailable", fence.key, fence, f"could not step down: {exc}")

    async def _release(self, fence: Fence, error: str) -> None:
        error = redact(error)  # stored: no secret leaves the process in a record
        try:
            released = await self.store.release(fence, error=error)
            await due_now(self.store, fence.key)
            # The log says what the store did: a lease no longer ours was not released.
            note = "" if released else " (not released: the store no longer held this lease)"
            self._emit("released", fence.key, fence, error + note)
        except StoreUnavailable as exc:  # the lease lapses on its own
            self._emit("store_unavailable", fence.key, fence, str(exc))

    async def _fail(self, fence: Fence, reason: str) -> None:
        reason = redact(reason)
        try:
            await self.store.fail(fence, reason)
            self._emit("failed", fence.key, fence, reason)
        except StoreUnavailable as exc:  # the lease lapses; the next attempt records it
            self._emit("store_unavailable", fence.key, fence, str(exc))
        except FencingRejected as exc:
            self._fenced(fence, exc)


async def _alongside(work: Awaitable[T], keeper: LeaseKeeper) -> T:
    """Run ``work`` in this task with ``keeper`` beside it; the first to fail stops the other.

    The keeper's task is created only when its first renewal (or the self-fence point) is
    due: a timer until then, so a job shorter than one renew interval runs no extra task.
    If the keeper fails (lease lost, stalled, self-fenced) it cancels this task and its
    error is raised here; a cancellation from outside (the job deadline, a shutdown) wins.
    Work that fails on its own while the lease is gone (after a stopped process wakes, a
    stream timeout and the self-fence are due together) fails for the lease, not for its
    own error: the keeper's error (or the self-fence) is raised, from the work's.
    """
    loop = asyncio.get_running_loop()
    this = asyncio.current_task()
    assert this is not None
    keeper.work = this
    cancelling = this.cancelling()
    keeper_task: asyncio.Task[Any] | None = None
    failure: list[BaseException] = []  # the keeper's error, once it has stopped the work
    finished = False

    def keeper_done(task: asyncio.Task[Any]) -> None:
        # Retrieved even when the work is over: no "Task exception was never retrieved".
        error = task.exception() if not task.cancelled() else None
        if finished:
            return
        # Only we cancel the keeper, and only once the work is over: a keeper that ended
        # any other way (even by a stray CancelledError) means nobody keeps the lease.
        failure.append(
            error or LeaseLost(keeper.fence.key, "the lease keeper stopped", keeper.fence)
        )
        this.cancel()

    def start_keeper() -> None:
        nonlocal keeper_task
        keeper_task = loop.create_task(keeper.run(), name=f"ai-lease keeper {keeper.fence.key}")
        keeper_task.add_done_callback(keeper_done)

    # The keeper's clock and the loop's are both monotonic, possibly offset: convert.
    timer = loop.call_at(loop.time() + (keeper.first_wake() - keeper.clock()), start_keeper)
    try:
        try:
            result = await work
        except asyncio.CancelledError:
            if failure and this.uncancel() <= cancelling:
                raise failure[0] from None
            raise
        except Exception as exc:
            if failure:  # the keeper's cancellation is pending or was turned into exc
                this.uncancel()
                raise failure[0] from exc
            lost = _keeper_error(keeper_task) or _lapsed(keeper)
            if lost is not None:
                raise lost from exc
            raise
        if failure:  # the work swallowed the keeper's cancellation: the lease is gone anyway
            this.uncancel()
            raise failure[0]
        return result
    finally:
        finished = True
        timer.cancel()
        if keeper_task is not None and not keeper_task.done():
            keeper_task.cancel()
            await asyncio.wait([keeper_task])  # never leave the renewal loop running


def _keeper_error(task: asyncio.Task[Any] | None) -> BaseException | None:
    """The error of a keeper that has just failed (its done callback not run yet)."""
    if task is None or not task.done() or task.cancelled():
        return None
    return task.exception()


def _lapsed(keeper: LeaseKeeper) -> LeaseLost | None:
    """The self-fence's error if the lease may have lapsed by now, else None."""
    try:
        keeper.ensure_lease()
    except LeaseLost as exc:
        return exc
    return None


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
