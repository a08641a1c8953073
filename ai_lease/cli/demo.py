"""``ai-lease demo``: the first seed's section-6 timeline, for real, in about 16 seconds.

Three node processes race for one job on the embedded store. The winner's model call
streams a little and then hangs — its heartbeat task is alive, its business is not. Its
keeper stops renewing once the stage's no-progress budget runs out, the lease lapses, and a
follower takes over with a higher fencing token and finishes. The old owner then wakes up
and tries to write its late result: the store rejects the stale token. One result.

Each node is ``python -m ai_lease.cli.demo node …`` and prints its events as JSON lines; the
parent merges them into a timeline (or re-emits them with ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import orjson

from ai_lease.client import Client, connect
from ai_lease.errors import FencingRejected
from ai_lease.job import Job
from ai_lease.lease import Fence
from ai_lease.lease.base import LeaseStore
from ai_lease.lease.events import Event
from ai_lease.providers.base import Completion
from ai_lease.run.config import RunConfig
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.timeouts import LeaseTimings, StageBudget

__all__ = ["DEMO_TIMINGS", "run", "run_demo"]

DEMO_TIMINGS = LeaseTimings(
    ttl=6.0,
    renew_interval=1.0,
    op_timeout=0.5,
    poll_interval=0.25,
    self_fence_margin=1.0,
    stage_budgets={
        "load": StageBudget(2.0, 10.0),
        "build_prompt": StageBudget(2.0, 10.0),
        "call_ai": StageBudget(4.0, 60.0),
        "parse": StageBudget(2.0, 10.0),
        "persist": StageBudget(2.0, 10.0),
    },
)
WORDS = ("Heartbeats", "prove", "life;", "progress", "proves", "work.")


async def _model_call(store: LeaseStore, ctx: StageContext) -> Completion:
    """The demo's call_ai: the first attempt streams three words, then hangs for good."""
    job = await store.get(ctx.fence.key)
    first_attempt = job is not None and job.attempts == 1
    text = []
    for i, word in enumerate(WORDS):
        if first_attempt and i == 3:
            _say(
                "hung",
                ctx.fence,
                "the model call hangs; the heartbeat task lives on",
                stage="call_ai",
            )
            await asyncio.Event().wait()
        await asyncio.sleep(0.4)
        text.append(word)
        ctx.progress(i)
    return Completion(" ".join(text), "stop")


def _say(kind: str, fence: Fence | None, detail: str, stage: str | None = None) -> None:
    event = Event(
        kind,
        fence.key if fence else "",
        fence.owner_id if fence else None,
        fence.token if fence else None,
        stage,
        None,
        detail,
    )
    _emit(event)


def _emit(event: Event) -> None:
    sys.stdout.write(orjson.dumps({**event.to_dict(), "node": _NODE[0]}).decode() + "\n")
    sys.stdout.flush()


_NODE = ["?"]


async def _node(name: str, url: str, key: str, start_at: float) -> None:
    _NODE[0] = name
    opened = Client.open(url)  # the store's own op timeout, not the demo's short one
    store = opened.store
    stalled: list[Fence] = []

    def on_event(event: Event) -> None:
        _emit(event)
        if event.kind == "stalled" and event.owner_id and event.token:
            stalled.append(Fence(event.key, event.owner_id, event.token))

    pipeline = Pipeline.default().replace("call_ai", Stage("call_ai", partial(_model_call, store)))
    client = connect(
        store,
        provider=None,
        pipeline=pipeline,
        config=RunConfig(timings=DEMO_TIMINGS, node_id=name),
        on_event=on_event,
    )
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        record = await client.run(
            Job(key, input="A heartbeat is not progress.", prompt_text="{{ input }}")
        )
        if stalled:  # the old owner wakes up and tries to write its late result
            await asyncio.sleep(1.0)
            try:
                await store.commit(stalled[0], orjson.dumps("the zombie's late result").decode())
                _say("late_write", stalled[0], "ACCEPTED (this would be a bug)")
            except FencingRejected as exc:
                _say("late_write", stalled[0], f"rejected: {exc}")
        _say("exit", None, f"result {record.output!r} from {record.owner_id}")
    finally:
        await opened.aclose()


# -- the parent: start three nodes, merge their timelines ---------------------------------------

_SHOWN = {
    "acquired",
    "following",
    "stage",
    "renewed",
    "renew_skipped",
    "renew_refused",
    "stalled",
    "hung",
    "committed",
    "fenced",
    "late_write",
    "done",
    "exit",
    "retry",
}


class Timeline:
    """Prints merged node events as a readable timeline."""

    def __init__(self, out: TextIO, as_json: bool) -> None:
        self.out, self.as_json, self.t0 = out, as_json, time.time()
        self.followed: set[tuple[str, str | None]] = set()

    def show(self, row: dict[str, Any]) -> None:
        if self.as_json:
            self.out.write(orjson.dumps(row).decode() + "\n")
            self.out.flush()
            return
        kind = row["kind"]
        if kind not in _SHOWN or (kind == "following" and not self._first_follow(row)):
            return
        token = f"token …{str(row['token'])[-6:]}" if row.get("token") else ""
        idle = f" idle {row['idle_s']:.1f}s" if row.get("idle_s") is not None else ""
        stage = f"[{row['stage']}]" if row.get("stage") else ""
        line = (
            f"+{row['at'] - self.t0:5.1f}s  {row['node']:<7} {kind:<13} {token:<13} "
            f"{stage:<15}{idle} {row.get('detail', '')}"
        )
        self.out.write(self._fit(line.rstrip()) + "\n")
        self.out.flush()

    def _fit(self, line: str) -> str:
        """A terminal's line is cut to its width; a file or a pipe gets it whole."""
        isatty = getattr(self.out, "isatty", None)
        if isatty is None or not isatty():
            return line
        width = shutil.get_terminal_size().columns
        return line if len(line) <= width else line[: width - 1] + "…"

    def _first_follow(self, row: dict[str, Any]) -> bool:
        mark = (row["node"], row.get("owner_id"))
        if mark in self.followed:
            return False
        self.followed.add(mark)
        return True


async def _pump(proc: asyncio.subprocess.Process, timeline: Timeline) -> None:
    assert proc.stdout is not None
    async for line in proc.stdout:
        with contextlib.suppress(orjson.JSONDecodeError):
            timeline.show(orjson.loads(line))


async def run_demo(
    store_url: str | None = None,
    *,
    as_json: bool = False,
    out: TextIO | None = None,
    ui: bool = False,
    open_browser: bool = True,
    linger: float | None = None,
    port: int | None = None,
) -> int:
    """Run the demo; return 0 when exactly one result was stored and the zombie was fenced.
    With ``ui``, the job is shown in a dashboard (:mod:`~ai_lease.cli.demo_ui`, on ``port``
    or a free one) that stays up ``linger`` seconds afterwards (None: until Ctrl-C)."""
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="ai-lease-demo-") as tmp:
        url = store_url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        key = f"demo-{time.strftime('%H%M%S')}-{os.getpid()}"
        if not as_json:
            out.write(
                f"ai-lease demo: 3 nodes race for job {key!r} on {url}\n"
                f"lease {DEMO_TIMINGS.ttl:g}s, renew every {DEMO_TIMINGS.renew_interval:g}s,"
                f" call_ai may go {DEMO_TIMINGS.budget('call_ai').max_no_progress:g}s "
                "without progress\n\n"
            )
        if not ui:
            return await _race(url, key, out, as_json)
        from ai_lease.cli import demo_ui

        await _create_store(url)  # the dashboard only looks: it needs the store to be there
        async with demo_ui.dashboard(url, port=port) as board:
            demo_ui.announce(board, key, out, open_browser=open_browser, as_json=as_json)
            code = await _race(url, key, out, as_json)
            await demo_ui.linger(board, key, out, linger, as_json=as_json)
        return code


async def _create_store(url: str) -> None:
    """Make the store at ``url`` (its first operation does) if it is not there yet."""
    client = Client.open(url)
    try:
        await client.list(limit=1)
    finally:
        await client.aclose()


async def _race(url: str, key: str, out: TextIO, as_json: bool) -> int:
    """Three node processes race for ``key``; the verdict's exit code."""
    timeline = Timeline(out, as_json)
    start_at = time.time() + 1.0
    # Each node in a session of its own: a terminal's Ctrl-C reaches only the demo, which stops
    # its nodes in the ``finally`` below. A node still importing when the group's SIGINT came
    # would print a KeyboardInterrupt traceback before its own handler was in place.
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ai_lease.cli.demo", "node", name, url, key, str(start_at)),
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        for name in ("node-a", "node-b", "node-c")
    ]
    pumps = asyncio.gather(*(_pump(p, timeline) for p in procs))
    try:
        await asyncio.wait_for(pumps, 90)
        codes = [await p.wait() for p in procs]
    finally:
        if pumps.done():  # after Ctrl-C: its end is retrieved, never logged as lost
            with contextlib.suppress(asyncio.CancelledError):
                pumps.exception()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return await _verdict(url, key, codes, out, as_json)


async def _verdict(url: str, key: str, codes: list[int], out: TextIO, as_json: bool) -> int:
    client = Client.open(url)
    try:
        record = await client.status(key)
    finally:
        await client.aclose()
    ok = record is not None and record.status.value == "DONE" and record.takeovers >= 1
    ok = ok and all(code == 0 for code in codes)
    if not as_json and record is not None:
        out.write(
            f"\none result: {record.output!r} by {record.owner_id} "
            f"(token …{str(record.token)[-6:]}, attempts {record.attempts}, "
            f"takeovers {record.takeovers})\n"
        )
        out.write("the zombie kept its heartbeat but not its job.\n" if ok else "UNEXPECTED\n")
    return 0 if ok else 1


def run(
    store_url: str | None = None,
    *,
    as_json: bool = False,
    ui: bool = False,
    open_browser: bool = True,
    linger: float | None = None,
    port: int | None = None,
) -> int:
    """``ai-lease demo``'s exit code. Ctrl-C stops the nodes (the demo's ``finally``), says so
    in one line and gives 130, never a traceback. With ``ui``, a ``port`` in use is one line
    and exit 2, before anything starts."""
    if ui:
        from ai_lease.cli.demo_ui import check_port

        check_port(port)
    demo = run_demo(
        store_url, as_json=as_json, ui=ui, open_browser=open_browser, linger=linger, port=port
    )
    try:
        return asyncio.run(demo)
    except KeyboardInterrupt:
        sys.stdout.flush()
        print("ai-lease: interrupted (SIGINT): demo stopped, its nodes too", file=sys.stderr)
        return 130


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m ai_lease.cli.demo")
    sub = parser.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node")
    for name in ("name", "url", "key", "start_at"):
        node.add_argument(name)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_node(args.name, args.url, args.key, float(args.start_at)))
    except KeyboardInterrupt:  # a node run by hand and stopped: quietly, as the demo would
        sys.exit(130)


if __name__ == "__main__":
    main(sys.argv[1:])
