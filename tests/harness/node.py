"""One node of an end-to-end timeline test: a real OS process running one job with a Runner.

    python -m tests.harness.node --store URL --key K --node NAME --history PATH \\
        --behaviour ok|slow|hang-async|hang-thread|pause-before-commit \\
        [--ttl 2 --renew 0.5 --mnp 1 --policy expire|release|alert --go-file PATH]
        [--isolation task|process]

Every :class:`~ai_lease.lease.events.Event` the runner emits is appended to the history file as
one JSON line (flushed at once, so a SIGKILL loses at most the line being written), plus
the node's own lines: ``started``, ``chunk`` (a content delta the provider streamed: real
progress), ``late_commit_rejected`` / ``late_commit_accepted`` (a zombie's write with its
old fence), ``at_commit`` and a final ``exit`` with the result the node got back.

Behaviours:

* ``ok``: a scripted model answers ``answer from NAME`` in a few quick chunks.
* ``slow``: one chunk every ``0.6 * mnp`` seconds for ``--slow-for`` seconds: slow but
  progressing, so it must never lose its lease.
* ``hang-async``: one chunk, then the model's stream hangs forever (``Stall()``). Once the
  keeper declares the stall, the node stops its runner (left alone, the runner competes
  again at once and, racing the follower, may win and stall again: the takeover would not
  be deterministic), waits until the store shows another owner, then writes with its old
  fence. Under ``--policy alert`` it just keeps running: the lease is kept, the miss
  recorded.
* ``hang-thread``: ``call_ai`` is a plain function blocking in ``time.sleep`` in a worker
  thread, which Python cannot cancel. When the store shows another owner, the thread wakes
  and writes its result with the fence it was given.
* ``pause-before-commit``: runs like ``ok``, but ``persist`` passes its local lease check,
  writes ``at_commit`` and then freezes its own process with SIGSTOP, so the pause falls
  exactly between the last local check and the store write; the test resumes it (SIGCONT)
  after a takeover and the write goes out with the old fence.

With ``--isolation process`` the job's stages up to ``parse`` run in a warm child process
(a pool of one, :func:`~ai_lease.run.isolation.isolated`) whose pid goes into the history
(``children``); the lease, the keeper, ``persist`` and the zombie's late write stay in the
node. A stalled or cancelled attempt stops its child by the termination ladder, so
``hang-thread``'s thread never wakes to write: the node writes with the old fence instead,
as ``hang-async`` does.

With ``--go-file`` the node starts (imports, opens the store) and then waits for that file
to exist before competing, so a test can start followers early yet let the owner win.

Tests drive nodes through :class:`Cluster` (start, signal, read histories, clean up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ai_lease import (
    Fence,
    FencingRejected,
    JobState,
    LeaseStore,
    LeaseTimings,
    StageBudget,
    StallPolicy,
    open_store,
)
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import StageContext
from ai_lease.run.isolation import isolated
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall, Step
from tests.harness.history import read_history

REAL_TIME = "an OS process of its own, waiting for the others through a real store"


__all__ = ["BEHAVIOURS", "Cluster", "NodeProcess", "main"]

BEHAVIOURS = ("ok", "slow", "hang-async", "hang-thread", "pause-before-commit")
REPO_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.05
GO_WAIT_S = 60.0
TERMINATE_GRACE_S = 0.5  # the child's SIGTERM window under --isolation process


# -- inside the node process -------------------------------------------------------------------


class History:
    """Appends JSON lines to one file, flushed per line; safe to call from any thread."""

    def __init__(self, path: Path, node: str) -> None:
        self.node = node
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, line: dict[str, Any]) -> None:
        data = {"node": self.node, "at": time.time(), **line}
        text = json.dumps(data, default=str) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class RecordingProvider:
    """Wraps a provider and writes a ``chunk`` history line per content delta it streams."""

    name = "recording"

    def __init__(self, inner: ScriptedProvider, history: History) -> None:
        self.inner, self.history = inner, history

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        deltas = self.inner.stream(request)
        try:
            async for delta in deltas:
                if delta.text:
                    self.history.write({"kind": "chunk", "text": delta.text})
                yield delta
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]

    async def complete(self, request: ChatRequest) -> Completion:
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Options:
    store: str
    key: str
    node: str
    history: Path
    behaviour: str
    ttl: float = 2.0
    renew: float = 0.5
    mnp: float = 1.0
    policy: str = "expire"
    slow_for: float | None = None
    go_file: Path | None = None
    isolation: str = "task"

    def timings(self) -> LeaseTimings:
        budgets = dict(LeaseTimings().stage_budgets)
        budgets["call_ai"] = StageBudget(self.mnp)
        return LeaseTimings(
            ttl=self.ttl,
            renew_interval=self.renew,
            op_timeout=min(0.4, self.renew / 2),
            poll_interval=0.1,
            self_fence_margin=self.ttl / 4,
            stall_policy=StallPolicy(self.policy),
            stage_budgets=budgets,
        )

    @property
    def answer(self) -> str:
        return f"answer from {self.node}"

    def script(self) -> list[Step]:
        if self.behaviour == "hang-async":
            return ["partial ", Stall()]
        if self.behaviour == "slow":
            pause = 0.6 * self.mnp
            steps: list[Step] = []
            for i in range(math.ceil((self.slow_for or 3 * self.ttl) / pause)):
                steps += [Pause(pause), f"part{i} "]
            return [*steps, self.answer]
        return ["answer ", Pause(0.05), "from ", Pause(0.05), self.node]


class Node:
    """One runner, one job, one history file."""

    def __init__(self, options: Options, store: LeaseStore, history: History) -> None:
        self.options, self.store, self.history = options, store, history
        self.stall_fence: Fence | None = None
        self.stalled = asyncio.Event()
        self.wake = threading.Event()  # wakes the blocked thread of ``hang-thread``
        self.late_done = asyncio.Event()
        self.pending: list[asyncio.Task[Any]] = []
        self.loop = asyncio.get_running_loop()
        provider = recording(options.script(), options.history, options.node)
        self.runner = Runner(
            store,
            provider=provider,
            pipeline=self.pipeline(),
            config=RunConfig(timings=options.timings(), node_id=options.node),
            hooks=RunHooks(on_event=self.on_event),
        )

    @property
    def isolated(self) -> bool:
        return self.options.isolation == "process"

    def pipeline(self) -> Pipeline:
        pipeline = Pipeline.default()
        if self.options.behaviour == "hang-thread":
            blocking = call_ai_blocking if self.isolated else self.call_ai_blocking
            pipeline = pipeline.replace("call_ai", Stage("call_ai", blocking))
        if self.options.behaviour == "pause-before-commit":
            pipeline = pipeline.replace("persist", Stage("persist", self.persist_paused))
        return pipeline

    def on_event(self, event: Event) -> None:
        self.history.write(event.to_dict())
        if event.kind == "stalled" and self.options.policy != "alert":
            assert event.owner_id is not None and event.token is not None
            self.stall_fence = Fence(event.key, event.owner_id, event.token)
            self.stalled.set()

    # -- the stuck work ------------------------------------------------------------------------

    def call_ai_blocking(self, ctx: StageContext) -> Completion:
        """A sync call_ai stuck in a worker thread until the store shows another owner."""
        cap = time.monotonic() + 10 * self.options.ttl
        while not self.wake.is_set() and time.monotonic() < cap:
            time.sleep(_POLL_S)
        late = asyncio.run_coroutine_threadsafe(
            self.late_commit(ctx.fence, self.options.answer), self.loop
        )
        with contextlib.suppress(FencingRejected):
            late.result(timeout=30)
        return Completion(self.options.answer, "stop")

    async def persist_paused(self, ctx: StageContext) -> Any:
        """persist, frozen by SIGSTOP between its last local lease check and the write."""
        value = ctx.output("parse")
        ctx.ensure_lease()
        self.history.write({"kind": "at_commit", "owner_id": ctx.fence.owner_id})
        os.kill(os.getpid(), signal.SIGSTOP)
        # Resumed. Shielded, so that the keeper noticing the lapsed lease and cancelling
        # this stage cannot hide what the store answered.
        late = asyncio.ensure_future(self.late_commit(ctx.fence, value))
        self.pending.append(late)
        await asyncio.shield(late)
        return value

    async def late_commit(self, fence: Fence, value: Any) -> JobState:
        """Write ``value`` with ``fence`` straight to the store; record what it answered."""
        line = {"owner_id": fence.owner_id, "token": fence.token}
        try:
            record = await self.store.commit(fence, json.dumps(value))
        except FencingRejected as exc:
            self.history.write({"kind": "late_commit_rejected", **line, "detail": str(exc)})
            raise
        finally:
            self.late_done.set()
        self.history.write({"kind": "late_commit_accepted", **line})
        return record

    async def wait_for_takeover(self, fence: Fence) -> None:
        """Until the store holds another (token, owner) for the key (bounded)."""
        deadline = time.monotonic() + 10 * self.options.ttl
        while time.monotonic() < deadline:
            record = await self.store.get(fence.key)
            if record is not None and not fence.holds(record):
                self.history.write({"kind": "takeover_seen", "token": record.token})
                return
            await asyncio.sleep(_POLL_S)
        self.history.write({"kind": "takeover_not_seen"})

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> tuple[Any, str | None]:
        """Run the job; return (result, error). A stalled zombie acts out its late write."""
        if not self.isolated:
            await self.wait_for_go()
            return await self.run_job()
        factory = functools.partial(
            recording, self.options.script(), self.options.history, self.options.node
        )
        async with isolated(self.runner, 1, factory, TERMINATE_GRACE_S) as pool:
            self.history.write({"kind": "children", "pids": sorted(pool.children)})
            await self.wait_for_go()  # the pool is warm before the node competes
            return await self.run_job()

    async def wait_for_go(self) -> None:
        await wait_for_go(self.options.go_file)
        self.history.write({"kind": "go"})

    async def run_job(self) -> tuple[Any, str | None]:
        job = Job(self.options.key, input=f"timeline for {self.options.key}")
        running = asyncio.create_task(self.runner.run(job))
        stalled = asyncio.create_task(self.stalled.wait())
        try:
            await asyncio.wait({running, stalled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stalled.cancel()
        if not running.done():
            await self.act_zombie(running)
            return None, "stalled"
        try:
            record = running.result()
        finally:
            await asyncio.gather(*self.pending, return_exceptions=True)
        return record.output, None

    async def act_zombie(self, running: asyncio.Task[Any]) -> None:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        self.history.write({"kind": "stopped_competing"})
        assert self.stall_fence is not None
        await self.wait_for_takeover(self.stall_fence)
        if self.options.behaviour == "hang-thread" and not self.isolated:
            self.wake.set()  # the thread writes, then returns
            await asyncio.wait_for(self.late_done.wait(), 30)
        else:
            with contextlib.suppress(FencingRejected):
                await self.late_commit(self.stall_fence, self.options.answer)


def recording(script: list[Step], history: Path, node: str) -> RecordingProvider:
    """The node's provider; module level, so a child process can build its own
    (``--isolation process``: its ``chunk`` lines go to the same history file)."""
    return RecordingProvider(ScriptedProvider(script), History(history, node))


def call_ai_blocking(ctx: StageContext) -> Completion:
    """``hang-thread``'s call_ai in a child process: stuck in ``time.sleep`` in the
    child's stage thread until the termination ladder ends the child (bounded)."""
    cap = time.monotonic() + 60
    while time.monotonic() < cap:
        time.sleep(_POLL_S)
    return Completion("too late", "stop")


async def wait_for_go(path: Path | None) -> None:
    if path is None:
        return
    deadline = time.monotonic() + GO_WAIT_S
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise TimeoutError(f"go file {path} did not appear within {GO_WAIT_S:g}s")
        await asyncio.sleep(0.02)


async def amain(options: Options) -> int:
    history = History(options.history, options.node)
    history.write({"kind": "started", "pid": os.getpid(), **_describe(options)})
    store = open_store(options.store, op_timeout=options.timings().op_timeout)
    result: Any = None
    error: str | None = None
    try:
        result, error = await Node(options, store, history).run()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        history.write({"kind": "exit", "result": result, "error": error})
        await store.aclose()
        history.close()
    return 0


def _describe(options: Options) -> dict[str, Any]:
    keys = ("behaviour", "ttl", "renew", "mnp", "policy", "isolation")
    return {key: getattr(options, key) for key in keys}


def parse_args(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.node")
    parser.add_argument("--store", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--history", required=True, type=Path)
    parser.add_argument("--behaviour", required=True, choices=BEHAVIOURS)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--renew", type=float, default=0.5)
    parser.add_argument("--mnp", type=float, default=1.0, help="call_ai max_no_progress")
    parser.add_argument("--policy", choices=[p.value for p in StallPolicy], default="expire")
    parser.add_argument("--slow-for", type=float, default=None)
    parser.add_argument("--go-file", type=Path, default=None)
    parser.add_argument("--isolation", choices=["task", "process"], default="task")
    return Options(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(sys.argv[1:] if argv is None else argv)))


# -- driving nodes from a test -----------------------------------------------------------------


@dataclass
class NodeProcess:
    """A running node, as the test sees it: its process, history and log."""

    name: str
    process: asyncio.subprocess.Process
    history: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        events = read_history(self.history)
        return events if kind is None else [e for e in events if e["kind"] == kind]

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)

    def state(self) -> str:
        """The kernel's one-letter process state (``T`` when stopped by SIGSTOP)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    async def wait_for(
        self,
        predicate: Callable[[list[dict[str, Any]]], Any],
        what: str,
        timeout: float = 30.0,
    ) -> Any:
        """Poll the history until ``predicate(events)`` is truthy; return its value.

        Fails with the history and log tail on timeout, or if the process exits first.
        """
        deadline = time.monotonic() + timeout
        while True:
            value = predicate(self.events())
            if value:
                return value
            if not self.running or time.monotonic() > deadline:
                why = "exited" if not self.running else f"timed out after {timeout:g}s"
                raise AssertionError(f"node {self.name} {why} waiting for {what}\n{self.dump()}")
            await asyncio.sleep(_POLL_S)

    async def wait_for_event(self, kind: str, what: str = "", timeout: float = 30.0) -> Any:
        events = await self.wait_for(
            lambda evs: [e for e in evs if e["kind"] == kind], what or kind, timeout
        )
        return events[0]

    async def exited(self, timeout: float = 30.0) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"node {self.name} did not exit\n{self.dump()}") from None

    def dump(self) -> str:
        lines = self.history.read_text() if self.history.exists() else "(no history)\n"
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- history of {self.name}\n{lines}--- log of {self.name}\n{log[-4000:]}"

    async def kill(self) -> None:
        """SIGKILL (works on a stopped process too) and reap."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        await self.process.wait()


@dataclass
class Cluster:
    """Node processes sharing one store and one job key; ``aclose()`` kills them all.

    >>> async with Cluster(url, "job-1", tmp_path) as cluster:            # doctest: +SKIP
    ...     owner = await cluster.start("A", "hang-async")
    ...     follower = await cluster.start("B", "ok", wait_for_go=True)
    """

    store_url: str
    key: str
    directory: Path
    ttl: float = 2.0
    renew: float = 0.5
    mnp: float = 1.0
    policy: str = "expire"
    isolation: str = "task"
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    @property
    def go_file(self) -> Path:
        return self.directory / f"{self.key}.go"

    async def start(
        self, name: str, behaviour: str, *, wait_for_go: bool = False, extra: Sequence[str] = ()
    ) -> NodeProcess:
        history = self.directory / f"{name}.history.jsonl"
        log = self.directory / f"{name}.log"
        args = [
            *("--store", self.store_url, "--key", self.key, "--node", name),
            *("--history", str(history), "--behaviour", behaviour),
            *("--ttl", str(self.ttl), "--renew", str(self.renew), "--mnp", str(self.mnp)),
            *("--policy", self.policy, "--isolation", self.isolation),
            *(("--go-file", str(self.go_file)) if wait_for_go else ()),
            *extra,
        ]
        node = await spawn("tests.harness.node", name, args, history, log)
        self.nodes[name] = node
        return node

    def go(self) -> None:
        """Let every node started with ``wait_for_go`` compete."""
        self.go_file.touch()

    def histories(self) -> dict[str, list[dict[str, Any]]]:
        return {name: node.events() for name, node in self.nodes.items()}

    def dump(self) -> str:
        return "\n".join(node.dump() for node in self.nodes.values())

    async def aclose(self) -> None:
        for node in self.nodes.values():
            await node.kill()

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def spawn(
    module: str,
    name: str,
    args: Sequence[str],
    history: Path,
    log: Path,
    env: dict[str, str] | None = None,
) -> NodeProcess:
    """Start ``python -m module *args`` from the repository root, output to ``log``."""
    out = log.open("wb")  # the child inherits the descriptor; ours is closed at once
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            cwd=REPO_ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    finally:
        out.close()
    return NodeProcess(name, process, history, log)


if __name__ == "__main__":
    sys.exit(main())
