"""The loop watchdog: a blocked event loop is reported once per stall with the stack of the
blocking call, and its end too; `ai-lease worker` runs one (a provider calling time.sleep
under --isolation task)."""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest

from ai_lease.lease.events import Event
from ai_lease.observe.loop_watchdog import LoopWatchdog, watch_loop
from tests.test_log_json_whole import STARTUP_S, CliWorker, submit_detached


def test_a_stall_is_reported_once_and_its_end_once() -> None:
    """Injected clock: no event while beats are fresh; one loop_blocked (with the loop
    thread's stack) however long the stall; one loop_resumed once a beat lands again."""
    seen: list[Event] = []
    now = [100.0]
    loop = asyncio.new_event_loop()
    try:
        dog = LoopWatchdog(loop, seen.append, after_s=2.0, clock=lambda: now[0])
        dog.loop_thread = threading.get_ident()  # this thread plays the loop's
        dog.check(101.9)
        assert seen == []
        dog.check(102.0)
        dog.check(150.0)
        assert [e.kind for e in seen] == ["loop_blocked"]
        assert seen[0].idle_s == 2.0 and "ran no callback for 2.0s" in seen[0].detail
        assert "test_a_stall_is_reported_once_and_its_end_once" in seen[0].detail
        dog.beat_at = 150.5  # the loop ran again
        dog.check(150.6)
        dog.check(151.0)
        assert [e.kind for e in seen] == ["loop_blocked", "loop_resumed"]
        assert seen[1].idle_s == 50.5
    finally:
        loop.close()


def _blocking_provider_call(seconds: float) -> None:
    time.sleep(seconds)  # what a sync call inside async code does to the loop


async def test_a_real_blocked_loop_is_reported_with_the_blocking_frame() -> None:
    """A coroutine that calls time.sleep(2) on the loop: a loop_blocked event whose stack
    names the blocking function, then loop_resumed."""
    seen: list[Event] = []
    with watch_loop(seen.append, after_s=0.5):
        await asyncio.sleep(0.1)  # real: the watchdog is a thread watching a really blocked loop
        _blocking_provider_call(2.0)
        for _ in range(100):  # generous: the watchdog reports within a beat of a beat
            await asyncio.sleep(0.05)
            if _resumed_after(seen, "_blocking_provider_call"):
                break
    assert _resumed_after(seen, "_blocking_provider_call"), [(e.kind, e.detail) for e in seen]
    blocked = next(e.detail for e in seen if "_blocking_provider_call" in e.detail)
    assert "time.sleep(seconds)" in blocked, blocked


def _resumed_after(seen: list[Event], frame: str) -> bool:
    """A loop_blocked naming ``frame``, then a loop_resumed (a stall of a loaded machine's
    own before it may come and go: it names no such frame)."""
    kinds = [e.kind for e in seen]
    named = [i for i, e in enumerate(seen) if e.kind == "loop_blocked" and frame in e.detail]
    return bool(named) and "loop_resumed" in kinds[named[0] :]


SLEEPY = """
import time
from ai_lease.providers.base import Completion, Delta

class SleepyProvider:
    name = "sleepy"
    async def stream(self, request):
        time.sleep(3)  # blocks the worker's loop
        yield Delta(text="late")
        yield Delta(finish_reason="stop")
    async def complete(self, request):
        time.sleep(3)  # blocks the worker's loop
        return Completion(text="late", finish_reason="stop")
    async def aclose(self):
        pass

def make(**options):
    return SleepyProvider()
"""


def _sleepy_plugin(where: Path) -> None:
    """A provider package found by its entry point: it calls time.sleep in async code."""
    (where / "sleepy_llm.py").write_text(textwrap.dedent(SLEEPY))
    dist = where / "sleepy_llm-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sleepy-llm\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nsleepy = sleepy_llm:make\n")


@pytest.mark.slow
def test_the_worker_reports_a_provider_that_blocks_its_loop(tmp_path: Path) -> None:
    """`ai-lease worker --isolation task --blocked-loop-after 1 --log-json` running a job
    whose provider calls time.sleep(3): a loop_blocked line naming that frame, then
    loop_resumed; every stderr line is JSON."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _sleepy_plugin(plugins)
    (tmp_path / "in.txt").write_text("some input")
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "in.txt"\n'
    )
    extra = {"PYTHONPATH": str(plugins), "AI_LEASE_PROVIDER__NAME": "sleepy"}
    url = submit_detached(tmp_path, extra)
    args = ("--isolation", "task", "--blocked-loop-after", "1.0")
    worker = CliWorker(url, *args, cwd=tmp_path, extra=extra)
    try:
        worker.wait_for(
            lambda _: _resumed_after(_loop_events(worker), "sleepy_llm.py"),
            "loop_blocked naming the provider, then loop_resumed",
            STARTUP_S,
        )
    finally:
        worker.stop()
    records = worker.records()  # every line JSON
    blocked = next(r for r in records if "sleepy_llm.py" in str(r["detail"]))
    assert blocked["level"] == "WARNING" and "time.sleep(3)" in str(blocked["detail"]), blocked


def _loop_events(worker: CliWorker) -> list[Event]:
    """The watchdog's events among the lines the worker wrote so far."""
    found = []
    for line in list(worker.lines):
        if '"loop_' in line:
            record = orjson.loads(line)
            found.append(Event(str(record["event"]), "", detail=str(record["detail"])))
    return found
