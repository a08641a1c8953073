"""A node process for the chaos scenarios: one Runner, one or more job keys, a fault plan.

    python -m tests.harness.chaos_node --store URL --keys K1[,K2…] --node NAME --history PATH \\
        [--faults "after:parse=kill"] [--calls ok|hang|slow,ok…] [--sse-url URL] \\
        [--go-file PATH] [--ttl 2 --renew 0.5 --op-timeout 0.4 --poll 0.1 --mnp 3 \\
         --first-token 2 --idle 2 --total 8 --chunks 4 --every 0.05]

Environment (read once, before ai_lease is imported):

* ``CHAOS_TIME_SHIFT=SECONDS[@AFTER]``: ``time.time`` returns the real time plus SECONDS
  (from AFTER seconds after start on the monotonic clock, if given): a wall clock that is
  off, or that jumps mid-job. History lines keep the *real* time, so histories of several
  processes stay comparable.
* ``CHAOS_API_KEY``: the API key of the OpenAI-compatible provider (``--sse-url``).

The history file gets every runner :class:`~ai_lease.lease.events.Event` (``at`` is the real time
the line was written; ``event_at`` the event's own, possibly shifted, time) and the node's
own lines: ``started``, ``ready`` (store reached, waiting for the go file), ``go``, ``call``
(the model was called for ``key``: count these to prove a follower did not call it again),
``commit_sent`` / ``commit_answer`` (a commit and what the store answered to it, written
even if the owner stopped waiting for the answer),
``chunk`` (a content delta: real progress), ``fault`` (a fault point fired; written before
the process stops or dies), ``commit_landed`` (``store.commit`` returned, at the
``after_commit`` point: the proof of a commit by an owner killed there before its runner
could report it) and one ``exit`` line per key with the result or the error.

The model (without ``--sse-url``) is scripted, per call of one key, by ``--calls``: ``ok``
streams ``--chunks`` pieces of ``<key> answered by <node>`` every ``--every`` seconds;
``hang`` streams one piece then hangs; ``slow`` streams like ``ok`` but for ``--slow-for``
seconds. The last behaviour repeats for later calls.

With ``--go-file`` the node connects first (so the store's scripts are loaded), writes
``ready``, then waits for the file; if it holds a number, that is the wall-clock instant
(real time) at which to start, so many processes can start together.
"""

from __future__ import annotations

import os
import time

_REAL_TIME = time.time


def _install_time_shift(spec: str | None) -> None:
    """Patch ``time.time`` before ai_lease (or anything else) binds it."""
    if not spec:
        return
    shift_text, _, after_text = spec.partition("@")
    shift, after = float(shift_text), float(after_text or 0.0)
    started = time.monotonic()

    def shifted() -> float:
        if time.monotonic() - started >= after:
            return _REAL_TIME() + shift
        return _REAL_TIME()

    time.time = shifted


_install_time_shift(os.environ.get("CHAOS_TIME_SHIFT"))

import argparse  # noqa: E402 - after the clock patch, on purpose
import asyncio  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import AsyncIterator, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from ai_lease import (  # noqa: E402
    Fence,
    JobState,
    LeaseStore,
    LeaseTimings,
    StageBudget,
    StreamTimeouts,
    open_store,
)
from ai_lease.errors import StoreUnavailable  # noqa: E402
from ai_lease.job import Job  # noqa: E402
from ai_lease.lease.events import Event  # noqa: E402
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider  # noqa: E402
from ai_lease.run.config import RunConfig, RunHooks  # noqa: E402
from ai_lease.run.runner import Runner  # noqa: E402
from ai_lease.testing.faults import FaultPlan  # noqa: E402
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall, Step  # noqa: E402
from ai_lease.timeouts import RetryPolicy  # noqa: E402

REAL_TIME = "a node process of its own, waiting on a real store and on the other nodes"


__all__ = ["ChaosOptions", "main"]

CALLS = ("ok", "hang", "slow")
GO_WAIT_S = 60.0


class History:
    """JSON lines, flushed per line, real wall time in ``at``; safe from any thread."""

    def __init__(self, path: Path, node: str) -> None:
        self.node = node
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, line: dict[str, Any]) -> None:
        data = {"node": self.node, **line, "at": _REAL_TIME()}
        text = json.dumps(data, default=str) + "\n"
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def event(self, event: Event) -> None:
        line = event.to_dict()
        line["event_at"] = line.pop("at")
        self.write(line)

    def close(self) -> None:
        self._file.close()


@dataclass
class ChaosOptions:
    store: str
    keys: str
    node: str
    history: Path
    faults: str = ""
    calls: str = "ok"
    sse_url: str | None = None
    go_file: Path | None = None
    ttl: float = 2.0
    renew: float = 0.5
    op_timeout: float = 0.4
    poll: float = 0.1
    mnp: float = 3.0
    first_token: float = 2.0
    idle: float = 2.0
    total: float = 8.0
    chunks: int = 4
    every: float = 0.05
    slow_for: float = 3.0
    job_deadline: float = 120.0

    @property
    def key_list(self) -> list[str]:
        return [k for k in self.keys.split(",") if k]

    def timings(self) -> LeaseTimings:
        budgets = dict(LeaseTimings().stage_budgets)
        budgets["call_ai"] = StageBudget(self.mnp, 60.0)
        return LeaseTimings(
            ttl=self.ttl,
            renew_interval=self.renew,
            op_timeout=self.op_timeout,
            poll_interval=self.poll,
            self_fence_margin=self.ttl / 4,
            job_deadline=self.job_deadline,
            stage_budgets=budgets,
        )

    def stream_timeouts(self) -> StreamTimeouts:
        return StreamTimeouts(first_token=self.first_token, idle=self.idle, total=self.total)


class RecordingProvider:
    """Writes ``call`` per model call and ``chunk`` per content delta; plays a script per
    call (or forwards to a real provider)."""

    name = "chaos"

    def __init__(self, options: ChaosOptions, history: History, inner: Provider | None) -> None:
        self.options, self.history, self.inner = options, history, inner
        self.calls: Counter[str] = Counter()

    def answer(self, key: str) -> str:
        return f"{key} answered by {self.options.node}"

    def script(self, key: str, behaviour: str) -> list[Step]:
        text = self.answer(key)
        n = max(1, self.options.chunks)
        size = math.ceil(len(text) / n)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        if behaviour == "hang":
            return [pieces[0], Stall()]
        every = self.options.every
        if behaviour == "slow":
            every = self.options.slow_for / len(pieces)
        steps: list[Step] = []
        for piece in pieces:
            steps += [Pause(every), piece]
        return steps

    def behaviour(self, call: int) -> str:
        plan = self.options.calls.split(",")
        return plan[min(call, len(plan)) - 1]

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        key = str(request.messages[-1]["content"])
        self.calls[key] += 1
        behaviour = "sse" if self.inner else self.behaviour(self.calls[key])
        self.history.write(
            {"kind": "call", "key": key, "n": self.calls[key], "behaviour": behaviour}
        )
        source = self.inner or ScriptedProvider(self.script(key, behaviour))
        deltas = source.stream(request)
        try:
            async for delta in deltas:
                if delta.text:
                    self.history.write({"kind": "chunk", "key": key, "text": delta.text})
                yield delta
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]

    async def complete(self, request: ChatRequest) -> Completion:
        raise NotImplementedError("chaos jobs stream")

    async def aclose(self) -> None:
        if self.inner is not None:
            await self.inner.aclose()


class WitnessStore:
    """The store, with every commit and the store's answer to it written down
    (``commit_sent``, ``commit_answer``) even when the caller is cancelled while waiting:
    what the *store* decided, whatever the owner's own checks did meanwhile."""

    def __init__(self, store: LeaseStore, history: History) -> None:
        self._store, self._history = store, history
        self._pending: set[asyncio.Task[JobState]] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def commit(
        self, fence: Fence, result: str, *, finish_reason: str | None = None, **facts: Any
    ) -> JobState:
        line = {"key": fence.key, "owner_id": fence.owner_id, "token": fence.token}
        self._history.write({"kind": "commit_sent", **line})
        task = asyncio.ensure_future(
            self._store.commit(fence, result, finish_reason=finish_reason, **facts)
        )
        self._pending.add(task)

        def answered(done: asyncio.Task[JobState]) -> None:
            self._pending.discard(done)
            error = None if done.cancelled() else done.exception()
            answer = "cancelled" if done.cancelled() else "ok" if error is None else "rejected"
            detail = "" if error is None else f"{type(error).__name__}: {error}"
            self._history.write(
                {"kind": "commit_answer", **line, "answer": answer, "detail": detail}
            )

        task.add_done_callback(answered)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        await asyncio.gather(*self._pending, return_exceptions=True)


class ChaosNode:
    def __init__(self, options: ChaosOptions, history: History) -> None:
        self.options, self.history = options, history
        self.fences: dict[str, tuple[str | None, int | None]] = {}
        timings = options.timings()
        self.raw_store = open_store(options.store, op_timeout=timings.op_timeout)
        self.store = WitnessStore(self.raw_store, history)
        inner = None
        if options.sse_url:
            # Only the nodes a scenario points at an SSE server pay for the HTTP stack (0.2 s).
            from ai_lease.providers.openai_compat import OpenAICompatProvider

            inner = OpenAICompatProvider(
                base_url=options.sse_url, api_key=os.environ.get("CHAOS_API_KEY"), model="m"
            )
        self.provider = RecordingProvider(options, history, inner)
        plan = FaultPlan.parse(options.faults, self.on_fault) if options.faults else None
        self.runner = Runner(
            self.store,  # type: ignore[arg-type]
            provider=self.provider,
            config=RunConfig(
                timings=timings,
                stream_timeouts=options.stream_timeouts(),
                retry=RetryPolicy(attempts=5, initial=1.0),
                node_id=options.node,
                record_history=False,
                trace=False,
            ),
            hooks=RunHooks(on_event=self.on_event, fault=plan),
        )

    def on_event(self, event: Event) -> None:
        if event.kind == "acquired":
            self.fences[event.key] = (event.owner_id, event.token)
        self.history.event(event)

    def on_fault(self, point: str, action: str) -> None:
        self.history.write({"kind": "fault", "point": point, "action": action})
        if point == "after_commit" and len(self.fences) == 1:
            [(key, (owner_id, token))] = self.fences.items()
            self.history.write(
                {"kind": "commit_landed", "key": key, "owner_id": owner_id, "token": token}
            )

    async def run_one(self, key: str) -> None:
        job = Job(key, input=key, prompt_text="{{ input }}")
        try:
            record = await self.runner.run(job)
        except Exception as exc:
            self.history.write(
                {
                    "kind": "exit",
                    "key": key,
                    "result": None,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
            raise
        self.history.write({"kind": "exit", "key": key, "result": record.output, "error": None})

    async def warm_up(self, key: str, tries: int = 5) -> None:
        """Connect (and load the scripts) before the race. A store that answers unavailable
        is asked again, as a worker would ask it again: once in ~3,000 CI tests a fresh
        PostgreSQL connection's migration statement was cancelled from outside the node
        ("canceling statement due to user request"), and the scenario is about the race,
        not the warm-up. Each retry is in the history."""
        for left in range(tries - 1, -1, -1):
            try:
                await self.store.get(key)
                return
            except StoreUnavailable as exc:
                if not left:
                    raise
                self.history.write({"kind": "warm_up_retry", "error": str(exc)})
                await asyncio.sleep(0.2)

    async def run(self) -> int:
        keys = self.options.key_list
        await self.warm_up(keys[0])
        self.history.write({"kind": "ready"})
        await wait_for_go(self.options.go_file)
        self.history.write({"kind": "go"})
        results = await asyncio.gather(*(self.run_one(k) for k in keys), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for failure in failures:
            print(f"{type(failure).__name__}: {failure}", file=sys.stderr)
        return 1 if failures else 0

    async def aclose(self) -> None:
        await self.store.drain()
        await self.provider.aclose()
        await self.raw_store.aclose()


async def wait_for_go(path: Path | None) -> None:
    """Until ``path`` exists; then until the real wall-clock instant it names, if any."""
    if path is None:
        return
    deadline = time.monotonic() + GO_WAIT_S
    while not await asyncio.to_thread(path.exists):
        if time.monotonic() > deadline:
            raise TimeoutError(f"go file {path} did not appear within {GO_WAIT_S:g}s")
        await asyncio.sleep(0.01)
    text = (await asyncio.to_thread(path.read_text)).strip()
    if text:
        await asyncio.sleep(max(0.0, float(text) - _REAL_TIME()))


async def amain(options: ChaosOptions) -> int:
    history = History(options.history, options.node)
    history.write(
        {
            "kind": "started",
            "pid": os.getpid(),
            "ttl": options.ttl,
            "shift": os.environ.get("CHAOS_TIME_SHIFT"),
        }
    )
    node = ChaosNode(options, history)
    code = 1
    try:
        code = await node.run()
    finally:
        history.write({"kind": "finished", "code": code, "calls": dict(node.provider.calls)})
        await node.aclose()
        history.close()
    return code


def parse_args(argv: Sequence[str]) -> ChaosOptions:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.chaos_node")
    parser.add_argument("--store", required=True)
    parser.add_argument("--keys", required=True, help="comma-separated job keys")
    parser.add_argument("--node", required=True)
    parser.add_argument("--history", required=True, type=Path)
    parser.add_argument("--faults", default="")
    parser.add_argument("--calls", default="ok", help=f"per-call behaviours of {CALLS}")
    parser.add_argument("--sse-url", default=None)
    parser.add_argument("--go-file", type=Path, default=None)
    for name in ("ttl", "renew", "op-timeout", "poll", "mnp", "first-token", "idle", "total"):
        parser.add_argument(f"--{name}", type=float, default=None)
    parser.add_argument("--chunks", type=int, default=None)
    for name in ("every", "slow-for", "job-deadline"):
        parser.add_argument(f"--{name}", type=float, default=None)
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    options = ChaosOptions(**given)
    unknown = set(options.calls.split(",")) - set(CALLS)
    if unknown:
        parser.error(f"--calls: unknown behaviours {sorted(unknown)}")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
