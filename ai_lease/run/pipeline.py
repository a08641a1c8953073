"""Stages and the pipeline that runs them: load → build_prompt → call_ai → parse → persist.

A :class:`Stage` is a name, a callable taking a
:class:`~ai_lease.run.context.StageContext`, and optional budget overrides
(``max_no_progress``, hard ``deadline``; otherwise the settings' budget for that
stage name). Entering a stage is progress; inside a stage, call ``ctx.progress(marker)`` for
every real step forward.

An ``async`` stage function runs on the event loop and is cancelled when the job stalls or
loses its lease. A plain (sync) function runs in a worker thread: Python cannot cancel a
thread, so it runs on until it returns — the keeper still sees it make no progress and lets
the lease go, its stack lands in the stall snapshot, and fencing still rejects its write.

>>> async def enrich(ctx):
...     rows = ctx.output("load")
...     for i, row in enumerate(rows):
...         ...                      # real work
...         ctx.progress(i)          # one step forward per row
...     return rows
>>> pipeline = Pipeline.default().replace("load", Stage("load", enrich))
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ai_lease.errors import JobSpecError, StageDeadlineExceeded
from ai_lease.job import Job
from ai_lease.lease.events import EventSink
from ai_lease.prompts import PromptLibrary
from ai_lease.run.context import StageContext
from ai_lease.run.stages import (
    build_prompt,
    call_ai,
    load,
    parse,
    persist,
    read_input,
    rendered,
)
from ai_lease.timeouts import LeaseTimings, StageBudget

__all__ = ["Pipeline", "Stage"]

StageFn = Callable[[StageContext], Any]


@dataclass(frozen=True)
class Stage:
    """One step of a job. Budgets left as None come from the settings for ``name``."""

    name: str
    fn: StageFn
    max_no_progress: float | None = None
    deadline: float | None = None

    def budget(self, timings: LeaseTimings) -> StageBudget:
        base = timings.budget(self.name)
        return StageBudget(
            self.max_no_progress if self.max_no_progress is not None else base.max_no_progress,
            self.deadline if self.deadline is not None else base.deadline,
        )

    def __post_init__(self) -> None:
        is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None)  # noqa: B004 - async callable objects
        )
        object.__setattr__(self, "is_async", is_async)  # decided once, not per job

    is_async: bool = field(init=False, repr=False, compare=False, default=False)


class Pipeline:
    """An ordered list of uniquely named stages."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        names = [s.name for s in stages]
        if not stages or len(set(names)) != len(names):
            raise JobSpecError(f"a pipeline needs stages with unique names, got {names}")
        self.stages = tuple(stages)
        self._budgets_for: tuple[LeaseTimings, tuple[StageBudget, ...]] | None = None

    def budgets(self, timings: LeaseTimings) -> tuple[StageBudget, ...]:
        """Each stage's budget under ``timings`` (worked out once per timings object)."""
        cached = self._budgets_for
        if cached is None or cached[0] is not timings:
            cached = self._budgets_for = (timings, tuple(s.budget(timings) for s in self.stages))
        return cached[1]

    @classmethod
    def default(cls) -> Pipeline:
        """load → build_prompt → call_ai → parse → persist."""
        return cls(
            [
                Stage("load", load),
                Stage("build_prompt", build_prompt),
                Stage("call_ai", call_ai),
                Stage("parse", parse),
                Stage("persist", persist),
            ]
        )

    async def preflight(self, job: Job, prompts: PromptLibrary) -> dict[str, Any]:
        """Catch bad input before the job is recorded: with the default load and
        build_prompt stages, read the input and render the prompt once. Returns what it
        worked out, by stage name, for those stages to take instead of doing it again."""
        fns = {s.name: s.fn for s in self.stages}
        if fns.get("load") is load and fns.get("build_prompt") is build_prompt:
            data = await read_input(job)
            return {"load": data, "build_prompt": await rendered(job, prompts, data)}
        return {}

    def replace(self, name: str, stage: Stage) -> Pipeline:
        """A copy with stage ``name`` swapped for ``stage``."""
        if name not in {s.name for s in self.stages}:
            raise JobSpecError(f"no stage {name!r} in {[s.name for s in self.stages]}")
        return Pipeline([stage if s.name == name else s for s in self.stages])

    async def run(self, ctx: StageContext, timings: LeaseTimings, emit: EventSink | None) -> Any:
        """Run every stage in order; return the last stage's output. ``emit`` None: no
        events are built at all."""
        value: Any = None
        ctx._run.emit = emit
        budgets = self.budgets(timings)
        stage, budget = self.stages[0], budgets[0]  # named for the deadline's error below
        # One hard-deadline scope for the whole run; each stage moves its deadline (a number,
        # see _Deadline). Between two stages only ensure_lease() and enter() run, with no
        # await, so the previous stage's deadline cannot fire there.
        hard = asyncio.timeout(None)
        deadline = ctx._run.hard = _Deadline(hard)
        try:
            async with hard:
                for stage, budget in zip(self.stages, budgets, strict=True):
                    value = await _run_stage(ctx, stage, budget, deadline)
        except TimeoutError:
            if hard.expired():
                raise StageDeadlineExceeded(stage.name, budget.deadline) from None
            raise
        finally:
            deadline.close()
        return value


class _Deadline:
    """The running stage's hard deadline (loop time; None: none) on one timer: moving it
    later costs nothing (a timer that fires early only re-arms for the current deadline),
    moving it sooner re-arms the timer. When it is due, ``hard`` (the run's timeout scope)
    expires and cancels the work, so a stage's cancellation is told apart as before."""

    def __init__(self, hard: asyncio.Timeout) -> None:
        self.hard = hard
        self.at: float | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None

    def move(self, at: float | None) -> None:
        self.at = at
        timer = self._timer
        if at is not None and (timer is None or at < timer.when()):
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(at, self._due)

    def _due(self) -> None:
        self._timer, at = None, self.at
        if at is None:  # no deadline now (a fault point): the next stage arms its own
            return
        if self._loop.time() < at:  # the deadline moved later since this timer was armed
            self._timer = self._loop.call_at(at, self._due)
            return
        self.hard.reschedule(at)  # past already: the scope cancels the work at once

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def _run_stage(ctx: StageContext, stage: Stage, budget: StageBudget, hard: _Deadline) -> Any:
    """One stage under ``hard`` (the run's deadline, moved to this stage's deadline)."""
    tracker, faults, emit = ctx.tracker, ctx._run.fault_hook is not None, ctx._run.emit
    ctx.ensure_lease()
    tracker.enter(stage.name, budget)
    started = tracker.last_at
    if emit is not None:
        ctx.say("stage", f"max_no_progress {budget.max_no_progress:g}s", stage=stage.name)
    if faults:  # fault points stand between stages, under no deadline
        hard.move(None)
        await ctx.fault(f"before:{stage.name}")
    if math.isinf(budget.deadline):
        hard.move(None)
        ctx._run.deadline_at = None
    else:
        hard.move(asyncio.get_running_loop().time() + budget.deadline)
        ctx._run.deadline_at = tracker.clock() + budget.deadline
    value = await stage.fn(ctx) if stage.is_async else await _threaded(stage, ctx)
    if hard.hard.expired():  # the stage swallowed the deadline's cancellation
        raise StageDeadlineExceeded(stage.name, budget.deadline)
    ctx.outputs[stage.name] = value
    if faults:
        hard.move(None)
        await ctx.fault(f"after:{stage.name}")
    took = tracker.clock() - started
    ctx._run.ran.setdefault("stage_durations", {})[stage.name] = took  # kept in the record
    if emit is not None:
        ctx.say("stage_done", stage=stage.name, value=took)
    return value


# Sync stages get threads of their own: a stuck one keeps its thread (Python cannot cancel
# it), and must not starve the default pool that file reads and other to_thread calls use.
_STAGE_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="ai-lease-stage")


async def _threaded(stage: Stage, ctx: StageContext) -> Any:
    """Run a sync stage in a worker thread. The thread cannot be cancelled: if the job
    gives it up (stall, lost lease) and it then finishes after all, the owner was slow, not
    stuck — a ``false_takeover`` event says so, to show budgets that are too tight."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    future = loop.run_in_executor(_STAGE_THREADS, context.run, _in_thread, stage.fn, ctx)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:

        def finished_late(done: asyncio.Future[Any]) -> None:
            stalled_at = ctx._run.keeper.stalled_at
            if stalled_at is not None and not done.cancelled() and done.exception() is None:
                late = ctx.tracker.clock() - stalled_at
                ctx.say(
                    "false_takeover",
                    f"slow_not_stuck: finished {late:.2f}s after its stall",
                    stage=stage.name,
                    value=late,
                )

        future.add_done_callback(finished_late)
        raise


def _in_thread(fn: StageFn, ctx: StageContext) -> Any:
    ctx.tracker.thread_ident = threading.get_ident()
    try:
        return fn(ctx)
    finally:
        ctx.tracker.thread_ident = None
