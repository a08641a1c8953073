"""The child side of process isolation: a warm process that runs jobs' stages up to
``parse``, one job at a time, for the worker that started it.

The child imports ai_lease once, builds its provider from a picklable factory, and waits on
its pipe. For each job it runs the stages before ``persist`` under the job's budgets, writes
every progress mark into a shared-memory array the parent reads (no message, no store round
trip per mark), sends the events the stages say over the pipe, a resumable stream's
checkpoint when it moved (twice per renewal interval at most: the parent's keeper stores
it, so a takeover resumes the response instead of paying for it again), and finally the
last stage's value (bounded in size) or the error that ended it. It never touches the
store: the lease, the keeper and the fenced commit stay in the parent, which stops the child
(the termination ladder) when the job stalls, is cancelled or loses its lease. A child
dies with its worker (:func:`die_with_parent`, also set in the fork server:
ai_lease/run/isolation/forkserver.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

from ai_lease.errors import JobSpecError, ProviderError
from ai_lease.job import Job
from ai_lease.lease.base import Fence, LeaseStore
from ai_lease.lease.classify import describe, retryable
from ai_lease.lease.events import Event
from ai_lease.lease.keeper import LeaseKeeper
from ai_lease.lease.progress import Progress
from ai_lease.observe.logs import configure_logging
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import Checkpoint, Provider
from ai_lease.retry import MODEL_CALL, RetryPolicy
from ai_lease.run.context import StageContext
from ai_lease.run.isolation.env import trim_environ
from ai_lease.run.isolation.ladder import install_child_handlers
from ai_lease.run.pipeline import Pipeline
from ai_lease.run.provider_pick import MAX_BUILT
from ai_lease.timeouts import LeaseTimings, StageBudget, StreamLimits, StreamTimeouts

__all__ = ["MAX_RESULT_BYTES", "ChildSpec", "ProviderFactory", "Work", "child_main"]

MAX_RESULT_BYTES = 8 * 1024 * 1024
"""A child's reply (the parsed result) larger than this is refused (not retryable)."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

CHECKPOINT_EVERY_MIN_S = 0.05
"""The shortest pause between two looks at a stream's checkpoint in a child."""

VERSION, LAST_AT, STAGE = 0, 1, 2
"""Slots of the shared progress array: progress version, last progress time (monotonic,
system-wide on Linux), index of the running stage (-1: none yet)."""


class ProviderFactory:
    """A picklable provider factory by name and options, as the CLI builds providers:
    ``ProviderFactory("openai", model="…", api_key=…)``. Its repr names the provider only
    (the options may hold a key)."""

    def __init__(self, name: str, **options: Any) -> None:
        self.name, self.options = name, options

    def __call__(self) -> Provider:
        from ai_lease.providers import create_provider

        return create_provider(self.name, **self.options)

    def __repr__(self) -> str:
        return f"ProviderFactory({self.name!r})"


@dataclass(frozen=True)
class ChildSpec:
    """What every child of a pool is built from: picklable by rule (a provider object
    cannot cross processes; ``provider_factory`` builds one in the child, e.g.
    ``functools.partial(create_provider, "openai", model="…")``)."""

    pipeline: Pipeline
    provider_factory: Callable[[], Provider] | None = None
    prompt_folders: tuple[str, ...] = ()
    stream_timeouts: StreamTimeouts = field(default_factory=StreamTimeouts)
    stream_limits: StreamLimits = field(default_factory=StreamLimits)
    call_retry: RetryPolicy = MODEL_CALL
    cut: int = 0  # the stages [0, cut) run in the child
    log_json: bool = False  # the worker logs JSON lines: so do the child's loggers
    env_keep: tuple[str, ...] = ()  # names (globs) beyond env.py's allow-list


@dataclass(frozen=True)
class Work:
    """One job for a child."""

    job: Job
    fence: Fence
    prepared: Mapping[str, Any]
    resume_from: str | None
    timings: LeaseTimings
    listening: bool
    # The job's own provider (its spec names one): built once per distinct choice here.
    provider_factory: Callable[[], Provider] | None = None


class SharedProgress(Progress):
    """A :class:`Progress` whose version and last progress time live in the shared array
    the parent reads (the stream guard writes them directly, per chunk: so they are the
    array's slots, not copies), and which also says the running stage's index there."""

    __slots__ = ("_index", "_shared")

    def __init__(self, shared: Any, names: Sequence[str]) -> None:
        self._shared = shared
        self._index = {name: i for i, name in enumerate(names)}
        super().__init__()

    @property
    def version(self) -> int:
        return int(self._shared[VERSION])

    @version.setter
    def version(self, value: int) -> None:
        self._shared[VERSION] = value

    @property
    def last_at(self) -> float:
        return float(self._shared[LAST_AT])

    @last_at.setter
    def last_at(self, value: float) -> None:
        self._shared[LAST_AT] = value

    def enter(self, stage: str, budget: StageBudget) -> None:
        self._shared[STAGE] = self._index.get(stage, -1)
        super().enter(stage, budget)


class _NoKeeper:
    """The child's stand-in keeper: the parent owns the lease and stops the child."""

    stalled_at: float | None = None

    def ensure_lease(self) -> None:
        """Nothing to check here: the parent fences (it kills a child whose lease is gone)."""

    def commit_started(self) -> None:
        """The child never commits."""


class _Channel:
    """The child's end of the pipe: pickled messages, one sender at a time (a sync stage
    in a thread may say an event while the loop sends)."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self.lock = conn, threading.Lock()

    def send(self, message: tuple[Any, ...]) -> int:
        blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.conn.send_bytes(blob)
        return len(blob)


class _ChildContext(StageContext):
    """The child's stage context: a resumable stream's checkpoint (``openai-responses`` in
    background mode) also goes to the parent, whose keeper stores it at its renewals; at
    most once per ``checkpoint_every`` seconds, and no task of its own."""

    def __init__(self, *, channel: _Channel, checkpoint_every: float, **context: Any) -> None:
        super().__init__(**context)
        self.channel, self.checkpoint_every = channel, checkpoint_every
        self.sent_at = float("-inf")

    def note_checkpoint(self, point: Checkpoint) -> None:
        """Send the checkpoint noted *before* this one, whose batch the guard has
        collected by now (a provider reports a checkpoint before handing its batch over):
        its text and its sequence agree. Then note ``point`` as in-process."""
        now = time.monotonic()
        if now - self.sent_at >= self.checkpoint_every:
            blob = self.checkpoint_json()
            if blob is not None:
                self.channel.send(("checkpoint", blob))
                self.sent_at = now
        super().note_checkpoint(point)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op
    elsewhere): a child must not outlive the worker that owns its job's lease."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def child_main(conn: Connection, spec: ChildSpec, shared: Any, dump_path: str) -> None:
    """The child's entry point: handlers first, then serve jobs until the pipe closes.

    Ctrl-C reaches the whole process group: the child ignores SIGINT (asyncio then keeps
    no handler of its own either), since its worker drains the job and stops it through
    the pipe or the ladder; a traceback per child would only garble the worker's log."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    trim_environ(spec.env_keep)  # only what the job needs: no cloud key, no dashboard token
    if spec.log_json:  # a library's record in the child is a JSON line on the shared stderr
        configure_logging(json=True)
    die_with_parent()  # the fork server (or the worker, with spawn), which dies with it
    install_child_handlers(dump_path, on_terminate=_exit_on_sigterm)
    provider = spec.provider_factory() if spec.provider_factory is not None else None
    prompts = PromptLibrary(spec.prompt_folders)
    asyncio.run(_serve(_Channel(conn), spec, shared, _Providers(provider), prompts))


class _Providers:
    """The child's providers: its default, and one per job choice it was sent (by the
    choice), all closed when the child stops serving."""

    def __init__(self, default: Provider | None) -> None:
        self.default = default
        self.chosen: OrderedDict[Any, Provider] = OrderedDict()

    async def get(self, work: Work) -> Provider | None:
        """The provider for ``work`` (a child runs one job at a time: between jobs the
        least recently used ones beyond :data:`MAX_BUILT` are closed)."""
        if work.provider_factory is None:
            return self.default
        choice = work.job.provider
        if (known := self.chosen.get(choice)) is not None:
            self.chosen.move_to_end(choice)
            return known
        while len(self.chosen) >= MAX_BUILT:
            _, old = self.chosen.popitem(last=False)
            with contextlib.suppress(Exception):
                await old.aclose()
        known = self.chosen[choice] = work.provider_factory()
        return known

    async def aclose(self) -> None:
        for provider in (self.default, *self.chosen.values()):
            if provider is not None:
                with contextlib.suppress(Exception):
                    await provider.aclose()


def _exit_on_sigterm() -> None:
    """SIGTERM: exit now, status 143. Not ``sys.exit``: the interpreter's exit would wait
    for the stuck stage thread it is being stopped for. The kernel closes the child's
    descriptors and sockets; the parent audits that."""
    sys.stderr.flush()
    os._exit(143)


async def _serve(
    channel: _Channel, spec: ChildSpec, shared: Any, providers: _Providers, prompts: Any
) -> None:
    loop = asyncio.get_running_loop()
    stages = Pipeline(spec.pipeline.stages[: spec.cut])
    channel.send(("ready", os.getpid(), time.monotonic()))
    try:
        while True:
            work = await _next_work(loop, channel.conn)
            if work is None:
                return
            try:
                provider = await providers.get(work)
            except Exception as exc:  # the job's provider cannot be built: its failure
                channel.send(("failed", _portable(exc), True))
                continue
            await _run_one(channel, spec, stages, shared, provider, prompts, work)
    finally:
        await providers.aclose()


async def _next_work(loop: asyncio.AbstractEventLoop, conn: Connection) -> Work | None:
    """The next job from the pipe (None: the parent closed it or said stop)."""
    readable: asyncio.Future[None] = loop.create_future()
    loop.add_reader(conn.fileno(), _set_once, readable)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fileno())
    try:
        message = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return None
    return message if isinstance(message, Work) else None


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _run_one(
    channel: _Channel,
    spec: ChildSpec,
    stages: Pipeline,
    shared: Any,
    provider: Provider | None,
    prompts: Any,
    work: Work,
) -> None:
    """Run ``work``'s stages and send ``("done", value, ran, finish_reason, clean)`` or
    ``("failed", error, clean)``; ``clean`` False: a stage thread is still running."""
    tracker = SharedProgress(shared, [s.name for s in spec.pipeline.stages])
    ctx = _ChildContext(
        channel=channel,
        checkpoint_every=_checkpoint_every(work),
        job=work.job,
        fence=work.fence,
        store=cast(LeaseStore, None),  # stages before persist never touch the store
        tracker=tracker,
        keeper=cast(LeaseKeeper, _NoKeeper()),
        provider=provider,
        prompts=prompts,
        stream_timeouts=spec.stream_timeouts,
        stream_limits=spec.stream_limits,
        call_retry=spec.call_retry,
        prepared=work.prepared,
        resume_from=work.resume_from,
    )

    def emit(event: Event) -> None:
        channel.send(("event", event))

    try:
        value = await stages.run(ctx, work.timings, emit if work.listening else None)
    except Exception as exc:
        channel.send(("failed", _portable(exc), tracker.thread_ident is None))
        return
    reply = ("done", value, ctx._run.ran, ctx._run.finish_reason, tracker.thread_ident is None)
    blob = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    if len(blob) > MAX_RESULT_BYTES:
        error = JobSpecError(
            f"job {work.job.key!r}: its result is {len(blob)} bytes, over the "
            f"{MAX_RESULT_BYTES} a child process may send back (isolation = process)"
        )
        channel.send(("failed", error, True))
        return
    with channel.lock:
        channel.conn.send_bytes(blob)


def _checkpoint_every(work: Work) -> float:
    """Seconds between the child's looks at its stream's checkpoint: twice per renewal, so
    the parent's keeper stores one at most half a renewal old."""
    return max(CHECKPOINT_EVERY_MIN_S, work.timings.renew_interval / 2)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling, else a ProviderError saying the same (and as
    retryable), so the parent's attempt decides exactly as it would in-process."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return ProviderError(describe(exc), retryable=retryable(exc))
