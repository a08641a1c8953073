"""A worker as a real OS process, for the multi-worker tests and the workers benchmark.

    python -m tests.harness.worker_proc --store URL --id NAME --concurrency N --history PATH \\
        [--ttl 2 --renew 0.5 --sweep 0.2 --grace 30 --mnp 1] [--job-seconds S] [--hang-file P]
        [--log-kinds acquired,committed] [--go-file PATH [--warmup N]] [--base-url URL]

It builds a :class:`~ai_lease.run.runner.Runner` with fast lease timings (TTL 2 s, renewal every
0.5 s, store operations bounded at 0.4 s, polls every 0.1 s, self-fence 0.5 s ahead, call_ai
may go ``--mnp`` seconds without progress) and a :class:`~ai_lease.run.worker.Worker` with its
signal handlers installed, exactly as ``ai-lease worker`` does, and runs until the worker
stops. Every runner and worker :class:`~ai_lease.lease.events.Event` is appended to the history
file as one JSON line (``event.to_dict()`` plus ``node``: the worker id), flushed at once,
plus the process's own lines: ``started`` (pid, timings), ``call`` (the provider was called
for ``key``), ``hang`` (this call hangs) and ``exit``.

The model is scripted: a call streams one content chunk every 0.1 s for ``--job-seconds``
(0: answer at once), then ``<key> by <worker id>``. Jobs are submitted with their key as
their input and ``prompt_text="{{ input }}"``, so the provider sees which job it runs. With
``--hang-file``, a call for a job whose input contains ``hang`` stalls forever if it is the
first to create that file (``O_EXCL``): only the first attempt anywhere hangs. With
``--log-kinds`` only events of those kinds (and ``started``, ``worker_started``, ``exit``)
are written: the benchmark keeps the history's cost off the measured path. With
``--go-file`` the worker connects to the store, writes ``waiting`` and starts only once that
file exists, so a benchmark can start its clock for every worker at once; ``--warmup N``
first runs N throwaway jobs (``warmup-<id>-<i>``) through its runner, so first-use costs
(imports, template environment, Lua scripts, connections) stay off the clock. With
``--base-url`` the model is a real OpenAI-compatible server instead (the lean adapter,
model ``m``): the test's own loopback :class:`~tests.harness.sse_server.SSEServer`.

Tests drive workers through :class:`Workers` (start, signal, read histories, clean up); a
started worker is a :class:`~tests.harness.node.NodeProcess`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ai_lease import LeaseTimings, StageBudget, open_store
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall, Step
from tests.harness.node import History, NodeProcess, spawn, wait_for_go

__all__ = ["CHUNK_EVERY_S", "WorkerOptions", "Workers", "main"]

CHUNK_EVERY_S = 0.1
_ALWAYS = ("worker_started", "worker_stopped")


# -- inside the worker process -----------------------------------------------------------------


@dataclass
class WorkerOptions:
    store: str
    id: str
    concurrency: int
    history: Path
    ttl: float = 2.0
    renew: float = 0.5
    sweep: float = 0.2
    grace: float = 30.0
    mnp: float = 1.0
    job_seconds: float = 0.0
    finish_file: Path | None = None
    hang_file: Path | None = None
    log_kinds: str | None = None
    go_file: Path | None = None
    warmup: int = 0
    base_url: str | None = None

    def timings(self) -> LeaseTimings:
        budgets = dict(LeaseTimings().stage_budgets)
        budgets["call_ai"] = StageBudget(self.mnp)
        return LeaseTimings(
            ttl=self.ttl,
            renew_interval=self.renew,
            op_timeout=min(0.4, self.renew / 2),
            poll_interval=0.1,
            self_fence_margin=min(0.5, self.ttl / 4),
            stage_budgets=budgets,
        )


class WorkerProvider:
    """The scripted model: chunks every 0.1 s for ``job_seconds``; records every call."""

    name = "worker-test"

    def __init__(self, options: WorkerOptions, history: History) -> None:
        self.options, self.history = options, history
        self.calls = 0

    def script(self, key: str) -> list[Step]:
        if self._hangs(key):
            self.history.write({"kind": "hang", "key": key})
            return [Stall()]
        steps: list[Step] = []
        for i in range(math.ceil(self.options.job_seconds / CHUNK_EVERY_S)):
            steps += [Pause(CHUNK_EVERY_S), f"part{i} "]
        return [*steps, f"{key} by {self.options.id}"]

    def _hangs(self, key: str) -> bool:
        if self.options.hang_file is None or "hang" not in key:
            return False
        try:
            os.close(os.open(self.options.hang_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        key = str(request.messages[-1]["content"])
        self.calls += 1
        if self.options.log_kinds is None:
            self.history.write({"kind": "call", "key": key, "calls": self.calls})
        if self.options.finish_file is not None and not self._hangs(key):
            return self._until_finished(self.options.finish_file, request, key)
        return ScriptedProvider(self.script(key)).stream(request)

    async def _until_finished(
        self, finish_file: Path, request: ChatRequest, key: str
    ) -> AsyncIterator[Delta]:
        """A chunk every 0.1 s until ``finish_file`` exists, then the answer: a job that runs
        exactly as long as its test needs it running."""
        part = 0
        while not await asyncio.to_thread(finish_file.exists):
            await asyncio.sleep(CHUNK_EVERY_S)
            yield Delta(text=f"part{part} ")
            part += 1
        async for delta in ScriptedProvider([f"{key} by {self.options.id}"]).stream(request):
            yield delta

    async def complete(self, request: ChatRequest) -> Completion:
        raise NotImplementedError("jobs of the worker tests stream")

    async def aclose(self) -> None:
        pass


async def amain(options: WorkerOptions) -> int:
    history = History(options.history, options.id)
    history.write({"kind": "started", "pid": os.getpid(), **_describe(options)})

    kinds = None if options.log_kinds is None else {*options.log_kinds.split(","), *_ALWAYS}

    def record(event: Event) -> None:
        if kinds is None or event.kind in kinds:
            history.write(event.to_dict())

    timings = options.timings()
    store = open_store(options.store, op_timeout=timings.op_timeout)
    provider = WorkerProvider(options, history)
    model: Provider = provider
    if options.base_url is not None:
        from ai_lease.providers.openai_compat import OpenAICompatProvider  # 0.2 s of imports

        model = OpenAICompatProvider(base_url=options.base_url, model="m")
    runner = Runner(
        store,
        provider=model,
        config=RunConfig(timings=timings, node_id=options.id),
        hooks=RunHooks(on_event=record),
    )
    worker = Worker(
        store,
        runner,
        concurrency=options.concurrency,
        sweep_interval=options.sweep,
        grace=options.grace,
        worker_id=options.id,
        on_event=record,
    )
    undo = worker.install_signal_handlers()
    error: str | None = None
    try:
        if options.go_file is not None:
            await worker.queue.list_workers()  # connected, before the clock starts
            for i in range(options.warmup):
                key = f"warmup-{options.id}-{i}"
                await runner.run(Job(key, input=key, prompt_text="{{ input }}"))
            history.write({"kind": "waiting"})
            await wait_for_go(options.go_file)
        await worker.run()
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        undo()
        history.write(
            {"kind": "exit", "completed": worker.completed, "calls": provider.calls, "error": error}
        )
        await model.aclose()
        await store.aclose()
        history.close()
    return 0


def _describe(options: WorkerOptions) -> dict[str, Any]:
    keys = ("concurrency", "ttl", "renew", "sweep", "grace", "mnp", "job_seconds")
    return {key: getattr(options, key) for key in keys}


def parse_args(argv: Sequence[str]) -> WorkerOptions:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.worker_proc")
    parser.add_argument("--store", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--history", required=True, type=Path)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--renew", type=float, default=0.5)
    parser.add_argument("--sweep", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--mnp", type=float, default=1.0, help="call_ai max_no_progress")
    parser.add_argument("--job-seconds", type=float, default=0.0)
    parser.add_argument("--finish-file", type=Path, default=None, help="jobs run until it exists")
    parser.add_argument("--hang-file", type=Path, default=None)
    parser.add_argument("--log-kinds", default=None, help="comma-separated event kinds to log")
    parser.add_argument("--go-file", type=Path, default=None)
    parser.add_argument("--warmup", type=int, default=0, help="throwaway jobs before the go")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible server to call")
    return WorkerOptions(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(sys.argv[1:] if argv is None else argv)))


# -- driving workers from a test ---------------------------------------------------------------


@dataclass
class Workers:
    """Worker processes sharing one store; ``aclose()`` kills (SIGKILL) and reaps them all.

    >>> async with Workers(url, tmp_path) as workers:                      # doctest: +SKIP
    ...     a = await workers.start("A", concurrency=4, job_seconds=1.5)
    ...     await a.wait_for_event("worker_started")
    """

    store_url: str
    directory: Path
    ttl: float = 2.0
    renew: float = 0.5
    sweep: float = 0.2
    procs: dict[str, NodeProcess] = field(default_factory=dict)

    async def start(
        self,
        name: str,
        *,
        concurrency: int = 4,
        job_seconds: float = 0.0,
        until_finished: bool = False,
        grace: float = 30.0,
        wait_for_go: bool = False,
        extra: Sequence[str] = (),
    ) -> NodeProcess:
        history = self.directory / f"{name}.history.jsonl"
        log = self.directory / f"{name}.log"
        args = [
            *("--store", self.store_url, "--id", name, "--history", str(history)),
            *("--concurrency", str(concurrency), "--job-seconds", str(job_seconds)),
            *("--ttl", str(self.ttl), "--renew", str(self.renew), "--sweep", str(self.sweep)),
            *("--grace", str(grace)),
            *(("--go-file", str(self.go_file)) if wait_for_go else ()),
            *(("--finish-file", str(self.finish_file)) if until_finished else ()),
            *extra,
        ]
        proc = await spawn("tests.harness.worker_proc", name, args, history, log)
        self.procs[name] = proc
        return proc

    async def start_ready(self, name: str, **kwargs: Any) -> NodeProcess:
        """Start a worker and wait until it is looking for jobs (with ``wait_for_go``: until
        it waits for :meth:`go`)."""
        proc = await self.start(name, **kwargs)
        kind = "waiting" if kwargs.get("wait_for_go") else "worker_started"
        await proc.wait_for_event(kind, f"worker {name} to start")
        return proc

    @property
    def go_file(self) -> Path:
        return self.directory / "workers.go"

    @property
    def finish_file(self) -> Path:
        return self.directory / "jobs.finish"

    def finish(self) -> None:
        """Let the jobs of every worker started with ``until_finished`` end (each answers
        within 0.1 s)."""
        self.finish_file.touch()

    def go(self) -> None:
        """Let every worker started with ``wait_for_go`` run."""
        self.go_file.touch()

    def histories(self) -> dict[str, list[dict[str, Any]]]:
        return {name: proc.events() for name, proc in self.procs.items()}

    def dump(self) -> str:
        return "\n".join(proc.dump() for proc in self.procs.values())

    async def aclose(self) -> None:
        for proc in self.procs.values():
            await proc.kill()

    async def __aenter__(self) -> Workers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


if __name__ == "__main__":
    sys.exit(main())
