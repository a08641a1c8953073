"""Workers: processes that discover submitted jobs, compete for them and recover abandoned ones.

A worker repeatedly asks the store's queue which jobs are *due* — newly submitted, or
scheduled to be looked at again because the lease of their last owner may have lapsed —
and runs each through the same :class:`~ai_lease.run.runner.Runner` as everyone else: the lease
decides who runs a job (single-flight), the keeper renews only on progress, the final write
is fenced. Any number of workers on any number of machines may look at the same job; only
one acquires it, the others move it back to its owner's lease expiry. A job whose owner was
killed, paused or stalled is therefore picked up within one lease TTL plus one sweep
interval: those looks are *recovery* looks (``recover_at``), which every sweep asks for
before fresh work, so a backlog never delays them — and a full worker never does either:
recovery looks may run beyond ``concurrency`` by ``recovery_reserve`` jobs (default: as
many again; none for ``isolation="process"``, where each costs a warm child), and an owner
that lost its lease (self-fenced, fenced off) frees its slot at once instead of retrying in
it. Per-job failures never take a worker
down: a job that cannot be prepared (a bad stored spec, an unreadable input) ends FAILED
with its reason at once, and a key whose look keeps failing (a corrupt record) is
quarantined: reported once, then looked at no more than once per sweep interval.

On the first SIGTERM/SIGINT a worker stops taking jobs, lets running jobs finish within a
grace window, then steps down from the rest (release: another worker takes over at once)
and exits 0. A second signal stops everything at once (jobs still step down).

``isolation="process"`` runs each job's stages up to ``parse`` in a warm child process
(:mod:`ai_lease.run.isolation`): the worker keeps the lease, the keeper and the fenced
commit, and stops a stuck child by the termination ladder (snapshot, SIGTERM,
``terminate_grace``, SIGKILL). The provider then comes from ``provider_factory`` (picklable:
a provider object cannot cross processes). The default, ``"task"``, runs jobs as tasks of
the worker's own event loop.

A job whose spec names a provider (``[provider]`` in its job file) runs on that provider,
as the runner's ``provider_resolver`` builds it (``ai-lease worker`` resolves it from its
own settings: keys, base URLs, allowed hosts), in both isolations; a job asking for one
this worker cannot give (unknown, no key for it, a host its key may not go to) ends FAILED
at once, not retried, with the reason (:mod:`ai_lease.run.provider_pick`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Self

from ai_lease.errors import (
    AiLeaseError,
    InputError,
    JobConflict,
    JobFailed,
    JobSpecError,
    StoreUnavailable,
)
from ai_lease.failure import FailureKind
from ai_lease.job import Job
from ai_lease.lease.base import Acquired, Following, LeaseStore, require_store
from ai_lease.lease.events import Event, EventSink
from ai_lease.lease.queue import (
    MAX_REPORTED_JOBS,
    JobQueue,
    WorkerInfo,
    look_at,
    runnable,
    unschedules_ended,
)
from ai_lease.providers.base import Provider
from ai_lease.run.isolation import ChildPool, check_isolation, isolated
from ai_lease.run.outage import StoreOutage
from ai_lease.run.runner import Runner
from ai_lease.run.worker_values import MIN_SWEEP_INTERVAL, Quarantined, check_worker

__all__ = ["MIN_SWEEP_INTERVAL", "Worker"]


class Worker:
    """Runs due jobs, at most ``concurrency`` at a time (plus up to ``recovery_reserve``
    recoveries of lapsed jobs; None: ``concurrency``, or 0 with ``isolation="process"``),
    until :meth:`stop` is called.

    >>> worker = Worker(store, Runner(store, provider=provider), concurrency=4)  # doctest: +SKIP
    >>> await worker.run()                                                       # doctest: +SKIP

    Or as a block: ``async with worker:`` runs it in the background, and leaving the block
    stops it (running jobs get ``grace`` seconds) and waits until it has stopped.
    """

    def __init__(
        self,
        store: LeaseStore,
        runner: Runner,
        *,
        concurrency: int = 4,
        sweep_interval: float = 1.0,
        grace: float = 30.0,
        worker_id: str | None = None,
        on_event: EventSink | None = None,
        isolation: str = "task",
        provider_factory: Callable[[], Provider] | None = None,
        terminate_grace: float = 10.0,
        recovery_reserve: int | None = None,
    ) -> None:
        store = require_store(store, "Worker()")
        if not isinstance(store, JobQueue):
            raise TypeError(f"Worker(): {store!r} keeps no job queue")
        # A process worker's reserve costs warm children: none unless asked for.
        default = 0 if isolation == "process" else concurrency
        reserve = default if recovery_reserve is None else recovery_reserve
        check_worker(concurrency, reserve, sweep_interval, grace)
        self.reserve = reserve
        check_isolation(isolation, terminate_grace)
        if isolation == "process" and provider_factory is None and runner.provider is not None:
            raise ValueError(
                "Worker(isolation='process') needs provider_factory=: a picklable callable "
                "that builds the provider in each child (e.g. functools.partial("
                "create_provider, 'openai', model=...)); a provider object cannot cross "
                "processes"
            )
        self.isolation, self.terminate_grace = isolation, float(terminate_grace)
        self.provider_factory = provider_factory
        self.pool: ChildPool | None = None  # the warm children, while a process worker runs
        self.store, self.queue, self.runner = store, store, runner
        self._unschedules = unschedules_ended(store)
        self.concurrency, self.sweep_interval, self.grace = concurrency, sweep_interval, grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self.started_at = time.time()
        self.completed = 0
        self._running: dict[str, asyncio.Task[None]] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()  # a stop or a freed slot: the sweep pause ends early
        self._emit: EventSink = on_event or (lambda event: None)
        self.quarantined: dict[str, Quarantined] = {}
        self.outage = StoreOutage(lambda kind, key, detail, _: self._say(kind, detail, key))
        self._task: asyncio.Task[None] | None = None  # run(), while inside ``async with``

    async def __aenter__(self) -> Self:
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"ai-lease worker {self.worker_id}"
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop (at once if the block was cancelled) and wait; a worker's own crash raises."""
        task, self._task = self._task, None
        if task is None:
            return
        if exc is None or isinstance(exc, Exception):
            self.stop()
        else:  # cancelled, interrupted: running jobs step down at once
            self.kill()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # we were cancelled while draining: stop now, then go
                self.kill()
                await asyncio.wait([task])
            raise

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop taking jobs; running ones get ``grace`` seconds, then step down."""
        self._stopping.set()
        self._wake.set()

    def kill(self) -> None:
        """Stop now: every running job is cancelled (and steps down)."""
        self._stopping.set()
        self._wake.set()
        self.grace = 0.0
        for task in self._running.values():
            task.cancel()

    def install_signal_handlers(self) -> Callable[[], None]:
        """First SIGTERM/SIGINT: :meth:`stop`; the second: :meth:`kill`. Returns an undo."""
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            self._say(
                "signal",
                "stopping after running jobs" if not self._stopping.is_set() else "stopping now",
            )
            (self.kill if self._stopping.is_set() else self.stop)()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)

        def undo() -> None:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

        return undo

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Take due jobs until stopped; then drain within the grace window."""
        adaptive = self.runner.config.adaptive
        loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # asyncio | uvloop
        self._say(
            "worker_started",
            f"concurrency {self.concurrency}, adaptive budgets "
            + (f"on ({adaptive})" if adaptive else "off")
            + f", event loop {loop}",
        )
        try:
            async with self._isolated():
                async with asyncio.TaskGroup() as tg:
                    beat = tg.create_task(self._beat())
                    while not self._stopping.is_set():
                        await self._take(tg)
                        await self._pause()
                    await self._drain()
                    beat.cancel()
        finally:
            await self.runner.aclose_providers()  # those built for jobs' own choices
        await self.runner.flush_history()
        with contextlib.suppress(AiLeaseError):
            await self.queue.worker_gone(self.worker_id)
        self._say("worker_stopped", f"{self.completed} jobs completed")

    @contextlib.asynccontextmanager
    async def _isolated(self) -> AsyncIterator[None]:
        """With ``isolation="process"``: the warm pool, for the worker's life."""
        if self.isolation != "process":
            yield
            return
        size = self.concurrency + self.reserve  # a child for every job that may run at once
        async with isolated(
            self.runner, size, self.provider_factory, self.terminate_grace
        ) as self.pool:
            self._say("worker_isolation", f"process: {size} warm children")
            yield

    async def _take(self, tg: asyncio.TaskGroup) -> None:
        """Start due jobs: recoveries while the reserve has room, fresh ones in free slots."""
        room = self.concurrency + self.reserve - len(self._running)  # for recoveries
        if room <= 0:
            return
        free = self.concurrency - len(self._running)  # for fresh work (maybe none)
        asked = time.monotonic()
        try:
            recoveries, fresh = await self._due(room, free)
        except StoreUnavailable as exc:
            self.outage.failed("", exc)  # said once per outage, not once per sweep
            return
        self.outage.reached("", asked)  # an answer to a sweep asked before an outage ends none
        self._start_some(tg, recoveries, room)
        self._start_some(tg, fresh, self.concurrency - len(self._running))  # after recoveries

    def _start_some(self, tg: asyncio.TaskGroup, keys: list[str], limit: int) -> None:
        """Start up to ``limit`` of ``keys``: those not running here, nor in quarantine
        until later (a quarantined key looked at counts a look, then waits a sweep again)."""
        now = time.monotonic()
        for key in keys:
            if limit <= 0 or self._stopping.is_set():
                return
            held = self.quarantined.get(key)
            if key in self._running or (held is not None and held.next_look > now):
                continue
            if held is not None:
                held.looks += 1
                held.next_look = now + self.sweep_interval
            self._running[key] = tg.create_task(self._work(key))
            limit -= 1

    async def _due(self, room: int, free: int) -> tuple[list[str], list[str]]:
        """Due recovery looks (an abandoned job must not wait behind the backlog, nor for a
        free slot: up to ``room``), then fresh keys for ``free`` slots (none asked for when
        no slot is free). Each window is wider than the room it fills, and keys in
        quarantine do not narrow it."""
        extra = len(self._running) + len(self.quarantined)
        recoveries = await self.queue.due_recoveries(4 * room + extra)
        fresh: list[str] = []
        if free > 0:
            window = 4 * free + extra
            fresh = await self.queue.due(window)
            if len(fresh) < window:  # every due key is here: forget those no longer due
                for key in self.quarantined.keys() - set(fresh):
                    del self.quarantined[key]
        # Every worker sees the same oldest due keys; taking a random few of a wider window
        # spreads workers over different jobs instead of racing them all for the same one.
        random.shuffle(recoveries)
        random.shuffle(fresh)
        looked = set(recoveries)
        return recoveries, [key for key in fresh if key not in looked]

    async def _pause(self) -> None:
        """Until the next sweep, a freed slot, or a stop (one event and one timer: no
        waiter tasks)."""
        if self._stopping.is_set():
            return
        self._wake.clear()
        try:
            async with asyncio.timeout(self.sweep_interval):
                await self._wake.wait()
        except TimeoutError:
            pass  # the sweep interval passed: look for due jobs again

    async def _drain(self) -> None:
        running = list(self._running.values())
        if not running:
            return
        self._say("draining", f"{len(running)} running jobs, grace {self.grace:g}s")
        _, pending = await asyncio.wait(running, timeout=self.grace)
        for task in pending:
            task.cancel()  # the runner releases the lease as it unwinds
        if pending:
            await asyncio.wait(pending)

    async def _beat(self) -> None:
        ttl = max(3 * self.sweep_interval, 5.0)
        while True:
            info = WorkerInfo(
                self.worker_id,
                socket.gethostname(),
                os.getpid(),
                len(self._running),
                self.concurrency,
                time.time(),
                self.started_at,
                tuple(itertools.islice(self._running, MAX_REPORTED_JOBS)),
            )
            with contextlib.suppress(StoreUnavailable):
                await self.queue.worker_beat(info, ttl)
            await asyncio.sleep(ttl / 3)

    # -- one job ------------------------------------------------------------------------------

    async def _work(self, key: str) -> None:
        looked = False  # only a look that worked ends the sweep pause early
        try:
            await self._look_at(key)
            looked = True
            self.quarantined.pop(key, None)
        except asyncio.CancelledError:
            raise
        except (JobFailed, JobConflict) as exc:
            looked = True
            self._say("job_failed", str(exc), key)
            with contextlib.suppress(AiLeaseError):
                await self.queue.reschedule(key, None)
        except StoreUnavailable as exc:  # the key stays due; look again next sweep
            self.outage.failed(key, exc)
        except Exception as exc:  # a bug or a corrupt record must not take the worker down
            self._quarantine(key, f"{type(exc).__name__}: {exc}")
        finally:
            self._running.pop(key, None)
            if looked:
                self._wake.set()

    def _quarantine(self, key: str, reason: str) -> None:
        """Skip ``key`` until the next sweep interval; say so once per key (a key leaves the
        quarantine when a look at it works, or when it is no longer due)."""
        next_look = time.monotonic() + self.sweep_interval
        held = self.quarantined.get(key)
        if held is not None:
            held.next_look = max(held.next_look, next_look)
            return
        self.quarantined[key] = Quarantined(reason, next_look=next_look)
        self._say(
            "job_quarantined",
            f"{reason}; skipped, looked at again at most once per sweep "
            f"({len(self.quarantined)} in quarantine)",
            key,
        )

    async def _look_at(self, key: str) -> None:
        # One call: the record, and its queue entry moved (off the schedule: nothing to run;
        # to a live owner's expiry; or to when our own lease could lapse, should we die).
        record = await look_at(self.queue, key, self.runner.timings.ttl)
        if record is None or not runnable(record):
            return
        assert record.spec is not None  # runnable
        try:
            job = Job.from_spec(record.spec)
            if job.key != key:
                raise JobSpecError(f"stored job spec names another key ({job.key!r})")
            done = await self.runner.try_run(job)  # prepares (input, prompt), then acquires
        except InputError as exc:  # the job cannot be prepared: that is its own failure
            await self._fail_unprepared(key, f"the job could not be prepared: {exc}")
            return
        if done is None:  # someone else won it: look again when their lease may lapse
            current = await self.store.get(key)
            if current is not None and current.lease_expires_at is not None:
                await self.queue.recover_at(key, current.lease_expires_at)
            return
        if (done.owner_id or "").startswith(f"{self.runner.node_id}#"):  # ours, not a follow
            self.completed += 1
            if self._unschedules:  # our commit or fail took it off the schedule
                return
        await self.queue.reschedule(key, None)

    async def _fail_unprepared(self, key: str, reason: str) -> None:
        """End a job FAILED before any attempt ran it: take its lease (the store's fence is
        the only way to write a verdict), then fail it with ``reason``."""
        timings = self.runner.timings
        outcome = await self.store.acquire(
            key,
            f"{self.runner.node_id}#prepare.{secrets.token_hex(2)}",
            ttl=timings.ttl,
            max_no_progress=self.runner.pipeline.budgets(timings)[0].max_no_progress,
        )
        if isinstance(outcome, Following):  # another node got further: its lease decides
            await self.queue.recover_at(key, outcome.job.lease_expires_at or outcome.job.read_at)
            return
        if isinstance(outcome, Acquired):
            await self.store.fail(outcome.fence, reason, kind=FailureKind.BAD_INPUT)
            self._say("job_failed", f"job {key!r} failed: {reason}", key)
        await self.queue.reschedule(key, None)

    def _say(self, kind: str, detail: str, key: str = "") -> None:
        self._emit(Event(kind, key, self.worker_id, None, None, None, detail))
