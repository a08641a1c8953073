"""Process isolation for workers: each job's stages up to ``parse`` run in a warm child.

``Worker(..., isolation="process")`` starts a pool of child processes once (``forkserver``
on Linux, ``spawn`` elsewhere; each imports ai_lease and waits on a pipe), so a short job
pays a pipe round trip, not an interpreter start. The lease, the keeper and the fenced
commit stay in the worker: the child writes its progress marks into shared memory, which
the parent copies into the attempt's :class:`~ai_lease.lease.progress.Progress` (so the
keeper's and the store's progress gates work unchanged), and sends back the parsed result,
which the parent's ``persist`` commits, fenced.

When the attempt must stop the child — the keeper found it stalled, the job was cancelled,
its lease was lost, the worker is shutting down — the parent takes the child's snapshot
first (every thread's stack, by signal: it works while the child's loop or a C call is
stuck), then climbs the termination ladder: SIGTERM, ``terminate_grace`` seconds, SIGKILL;
it audits that the child is gone, starts a fresh child in its place, and the attempt ends
by the usual release/expire policy. A child that exits at once is not waited for. Each
signal and the reaping are events and, on a store with ``note`` (both built-in ones),
entries in the job's timeline (ai_lease/run/isolation/ladder_notes.py).

The rule for what crosses: the stage functions before ``persist`` and the provider
*factory* must be picklable (module-level functions, ``functools.partial`` of them); a
provider object cannot cross processes. A stage from ``persist`` on and the persist hook
run in the parent (they need not be picklable), seeing ``ctx.output("parse")`` only.
A resumable stream's checkpoint (``openai-responses`` in background mode) is sent by the
child when it moves and stored by the parent's keeper at its renewals, as in-process: a
takeover resumes the response (the record's checkpoint goes to the new child as
``resume_from``) instead of calling the model again.

A job whose spec names a provider runs in the child on that provider: the parent resolves
the job's choice to a picklable factory (``Runner(provider_resolver=…)``,
:mod:`ai_lease.run.provider_pick`) and sends it with the job; the child builds it once per
distinct choice and closes it when it exits. Jobs naming none run on the child's default,
built from ``provider_factory``.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.observe.logs import json_configured
from ai_lease.run.context import StageContext
from ai_lease.run.isolation.child import LAST_AT, STAGE, VERSION, ChildSpec, Work
from ai_lease.run.isolation.ladder import (
    ChildSnapshot,
    audit,
    cpu_seconds,
    snapshot_child,
    step_event,
    terminate,
)
from ai_lease.run.isolation.ladder_notes import noting
from ai_lease.run.isolation.pool import Child, ChildPool, receive
from ai_lease.run.pipeline import Pipeline
from ai_lease.run.slot_call import holding_slots
from ai_lease.timeouts import LeaseTimings

if TYPE_CHECKING:
    from ai_lease.job_provider import ProviderChoice
    from ai_lease.providers.base import Provider
    from ai_lease.run.runner import Runner

__all__ = [
    "ChildPool",
    "ChildWatch",
    "IsolatedPipeline",
    "check_isolation",
    "isolated",
    "split_at_persist",
]

MAX_TERMINATE_GRACE = 300.0
"""Seconds; the longest SIGTERM window a worker gives a child before SIGKILL."""

POLL_S = 0.05
"""Seconds between the parent's copies of the child's progress while it waits."""

CPU_EVERY_S = 0.25
"""Seconds between reads of the child's CPU time at its progress (for ``cpu_idle_pct``)."""


def check_isolation(isolation: str, terminate_grace: float) -> None:
    """Refuse an unknown isolation or a grace outside 0-300 s, naming the field."""
    if isolation not in ("task", "process"):
        raise ValueError(f"Worker.isolation: must be 'task' or 'process' (got {isolation!r})")
    if (
        isinstance(terminate_grace, bool)
        or not isinstance(terminate_grace, int | float)
        or not 0 <= terminate_grace <= MAX_TERMINATE_GRACE
    ):
        raise ValueError(
            "Worker.terminate_grace: must be a number of seconds from 0 to 300 "
            f"(got {terminate_grace!r})"
        )


@contextlib.asynccontextmanager
async def isolated(
    runner: Runner,
    size: int,
    provider_factory: Callable[[], Provider] | None,
    terminate_grace: float,
) -> AsyncIterator[ChildPool]:
    """A pool of ``size`` warm children, with ``runner``'s pipeline run through it inside
    the block (the runner gets its own pipeline back afterwards)."""
    pipeline, config = runner.pipeline, runner.config
    cut = split_at_persist(pipeline)
    spec = ChildSpec(
        Pipeline(pipeline.stages[:cut]) if cut else pipeline,  # only these cross: picklable
        provider_factory,
        tuple(str(f) for f in runner.prompts.folders),
        config.stream_timeouts,
        config.stream_limits,
        config.call_retry,
        cut,
        json_configured(),
    )
    pool = ChildPool(spec, size)
    try:
        await pool.start()
        runner.pipeline = IsolatedPipeline(
            pipeline, pool, terminate_grace=terminate_grace, factory_for=runner.providers.factory
        )
        yield pool
    finally:
        runner.pipeline = pipeline
        await pool.aclose()


def _slots(ctx: StageContext) -> contextlib.AbstractAsyncContextManager[object]:
    """The job's provider slots ([limits]), taken by the worker around its child: the
    child's model call runs under them, and a stuck child stopped by the ladder gives them
    back as its run ends here (none configured or matching: nothing)."""
    provider = ctx._run.provider
    if not ctx._run.limits or provider is None:
        return contextlib.nullcontext()
    choice = ctx.job.provider
    model = choice.model if choice is not None and choice.model else None
    return holding_slots(ctx, provider, model or getattr(provider, "model", None))


def split_at_persist(pipeline: Pipeline) -> int:
    """How many leading stages run in the child: every stage before ``persist``."""
    names = [s.name for s in pipeline.stages]
    return names.index("persist") if "persist" in names else len(names)


@dataclass
class ChildWatch:
    """What the parent knows of the child running one job, and the keeper's hooks into it
    (:attr:`~ai_lease.lease.keeper.LeaseKeeper.on_stall`, ``checkpoint``) meanwhile."""

    child: Child
    snapshot: ChildSnapshot | None = None  # the child's, taken for the stall
    cpu_at_progress: float | None = None  # the child's CPU seconds at its last progress
    cpu_read_at: float = float("-inf")  # when (monotonic) it was read
    latest_checkpoint: str | None = None  # the last the child sent (the record's JSON)

    async def on_stall(self, text: str, idle: float) -> str:
        """The stall's snapshot is the child's (every thread's stack, by signal, and its
        figures), under the keeper's first line; taken first, kept for the ladder."""
        child = self.child
        self.snapshot = snap = await snapshot_child(
            child.pid,
            child.dump_path,
            since_progress_cpu_s=self.cpu_at_progress,
            since_progress_s=idle,
        )
        return f"{text.splitlines()[0]}\n{snap.render(12_000)}"

    def checkpoint(self) -> str | None:
        """The keeper's checkpoint source: the child's latest, stored at its renewals."""
        return self.latest_checkpoint


class IsolatedPipeline(Pipeline):
    """``pipeline`` with its stages before ``persist`` run in a child of ``pool``."""

    def __init__(
        self,
        pipeline: Pipeline,
        pool: ChildPool,
        *,
        terminate_grace: float,
        factory_for: Callable[[str, ProviderChoice | None], Callable[[], Provider] | None]
        | None = None,
    ) -> None:
        super().__init__(pipeline.stages)
        self.pool, self.terminate_grace = pool, terminate_grace
        self.factory_for = factory_for  # a job's provider choice -> the child's factory
        self.cut = split_at_persist(pipeline)
        tail = pipeline.stages[self.cut :]
        self.tail = Pipeline(tail) if tail else None

    async def run(self, ctx: StageContext, timings: LeaseTimings, emit: Any) -> Any:
        """The child's stages, then the rest (``persist``) here; the child is stopped by
        the ladder if the attempt ends any other way while it runs."""
        if self.cut == 0:  # nothing to run in a child
            return await super().run(ctx, timings, emit)
        ctx._run.emit = emit
        async with _slots(ctx):  # [limits]: held here, for the child's whole run
            kind, value = await self._in_child(ctx, timings)
        if kind == "failed":
            raise value
        if self.tail is None:
            return value
        return await self.tail.run(ctx, timings, emit)

    async def _in_child(self, ctx: StageContext, timings: LeaseTimings) -> tuple[str, Any]:
        """The stages before ``persist`` in a warm child, stopped by the ladder if the
        attempt ends any other way meanwhile; the child goes back to the pool if clean."""
        child = await self.pool.take()
        keeper, watch = ctx._run.keeper, ChildWatch(child)
        hooks = keeper.checkpoint, keeper.on_stall
        keeper.checkpoint, keeper.on_stall = watch.checkpoint, watch.on_stall  # meanwhile
        try:
            kind, value, clean = await self._remote(watch, ctx, timings)
        except BaseException as exc:
            await _shielded(self._stop(watch, ctx, exc))
            raise
        finally:
            keeper.checkpoint, keeper.on_stall = hooks
        if clean:
            self.pool.give_back(child)
        else:  # a stage thread still runs in it (a deadline gave up on it): retire it
            await _shielded(self._stop(watch, ctx, None))
        return kind, value

    async def _remote(
        self, watch: ChildWatch, ctx: StageContext, timings: LeaseTimings
    ) -> tuple[str, Any, bool]:
        """Send the job; copy progress and pass events (and checkpoints) on until the
        child's answer: ``("done", value, clean)`` or ``("failed", error, clean)``."""
        child = watch.child
        shared = child.shared
        shared[VERSION], shared[LAST_AT], shared[STAGE] = 0.0, time.monotonic(), -1.0
        job = ctx.job
        factory = self.factory_for(job.key, job.provider) if self.factory_for else None
        work = Work(
            job,
            ctx.fence,
            ctx._run.prepared,
            ctx._run.resume_from,
            timings,
            ctx._run.emit is not None,
            provider_factory=factory,
        )
        child.conn.send_bytes(pickle.dumps(work, protocol=pickle.HIGHEST_PROTOCOL))
        budgets, seen = self.budgets(timings), 0.0
        while True:
            try:
                message = await receive(child, POLL_S)
            except TimeoutError:
                message = None
            seen = self._copy(watch, seen, ctx, budgets)
            if message is None:
                continue
            if message[0] == "event":
                if ctx._run.emit is not None:
                    ctx._run.emit(message[1])
            elif message[0] == "checkpoint":
                watch.latest_checkpoint = message[1]
            elif message[0] == "done":
                _, value, ran, finish_reason, clean = message
                ctx._run.ran.update(ran)
                ctx._run.finish_reason = finish_reason
                ctx.outputs[self.stages[self.cut - 1].name] = value
                return "done", value, clean
            else:
                return "failed", message[1], message[2]

    def _copy(self, watch: ChildWatch, seen: float, ctx: StageContext, budgets: Any) -> float:
        """The child's latest progress into the attempt's tracker (and, when it moved, the
        child's CPU time, for the snapshot's ``cpu_idle_pct``); returns the version. The
        time is copied at every look: the child may write it just after the version."""
        shared, tracker = watch.child.shared, ctx.tracker
        version = shared[VERSION]
        tracker.last_at = max(tracker.last_at, shared[LAST_AT])
        if version != seen:
            tracker.version = int(version)
            index = int(shared[STAGE])
            if 0 <= index < len(self.stages):
                tracker.stage, tracker.budget = self.stages[index].name, budgets[index]
            if tracker.last_at - watch.cpu_read_at > CPU_EVERY_S:
                watch.cpu_at_progress = cpu_seconds(watch.child.pid)  # /proc: rare
                watch.cpu_read_at = tracker.last_at
        return float(version)

    async def _stop(self, watch: ChildWatch, ctx: StageContext, why: BaseException | None) -> None:
        """The ladder: snapshot (unless the stall took it), SIGTERM, grace, SIGKILL; reap;
        audit; a fresh child in its place. ``why`` None: retiring a child left unclean."""
        child, pid = watch.child, watch.child.pid
        snap = watch.snapshot
        if why is not None and snap is None:
            snap = await snapshot_child(pid, child.dump_path, timeout=1.0)
        reason = _why(why, ctx._run.keeper)
        stacks = f"\n{snap.render(4096)}" if snap is not None and why is not None else ""
        ctx.say("terminating", f"child {pid}: {reason}{stacks}", attrs={"pid": pid})

        fence = ctx.fence
        async with noting(ctx._run.store, fence, ctx.tracker.stage) as note:

            def on_step(step: str, facts: dict[str, Any]) -> None:
                note(step, facts)  # into the job's stored timeline (a store with note())
                if ctx._run.emit is not None:
                    ids = {"owner_id": fence.owner_id, "token": fence.token, "stage": None}
                    ctx._run.emit(step_event(fence.key, step, facts, **ids))

            how = await terminate(
                pid, grace=self.terminate_grace, on_step=on_step, reap=_reaper(child)
            )
        inodes = snap.socket_inodes if snap is not None else ()
        report = audit(pid, sockets=inodes, hooks_ran=how == "term" or None)
        ctx.say("audited", f"child {pid}: {how}", attrs=_flat(report))
        await self.pool.replace(child)


def _why(why: BaseException | None, keeper: LeaseKeeper) -> str:
    """Why the child is being stopped, in words for the ``terminating`` event."""
    if why is None:
        return "a stage thread is still running in it"
    if keeper.stalled_at is not None:
        return "the job stalled"
    if isinstance(why, asyncio.CancelledError):
        return "the attempt was cancelled (lease lost, job cancelled or worker stopping)"
    return f"the attempt ended: {type(why).__name__}"


def _flat(report: dict[str, Any]) -> dict[str, float | int | str]:
    return {k: v if isinstance(v, int | float | str) else str(v) for k, v in report.items()}


def _reaper(child: Child) -> Callable[[], Awaitable[int | None]]:
    async def reap() -> int | None:
        await asyncio.to_thread(child.process.join, 5.0)
        return child.process.exitcode

    return reap


async def _shielded(stopping: Any) -> None:
    """Run the ladder to its end even if the attempt is cancelled again meanwhile."""
    task = asyncio.ensure_future(stopping)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise
    with contextlib.suppress(Exception):
        task.result()
