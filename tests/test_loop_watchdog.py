"""The loop watchdog: a blocked event loop is reported once per stall with the stack of the
blocking call, and its end too; `ai-lease worker` runs one (a provider calling time.sleep
under --isolation task)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest

from ai_lease.observe.events import Event
from ai_lease.observe.loop_watchdog import LoopWatchdog, watch_loop

STARTUP_S = 60.0  # generous: two CPUs shared with other test runs


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
    """A coroutine that calls time.sleep(1.5) on the loop: within the stall, a loop_blocked
    event whose stack names the blocking function; after it, loop_resumed."""
    seen: list[Event] = []
    with watch_loop(seen.append, after_s=0.3):
        await asyncio.sleep(0.2)
        _blocking_provider_call(1.5)
        for _ in range(100):  # generous: the watchdog reports within a beat of a beat
            await asyncio.sleep(0.05)
            if any(e.kind == "loop_resumed" for e in seen):
                break
    kinds = [e.kind for e in seen]
    assert kinds == ["loop_blocked", "loop_resumed"], kinds
    blocked = seen[0].detail
    assert "_blocking_provider_call" in blocked and "time.sleep(seconds)" in blocked, blocked


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
    """`ai-lease worker --isolation task --blocked-loop-after 0.5 --log-json` running a job
    whose provider calls time.sleep(3): a loop_blocked line naming that frame, then
    loop_resumed; every stderr line is JSON."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _sleepy_plugin(plugins)
    (tmp_path / "in.txt").write_text("some input")
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "in.txt"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env |= {"PYTHONPATH": str(plugins), "AI_LEASE_PROVIDER__NAME": "sleepy"}
    cli = [sys.executable, "-m", "ai_lease", "--store", f"sqlite:///{tmp_path / 's.db'}"]
    submitted = subprocess.run(
        [*cli, "submit", "job.toml", "--detach"], cwd=tmp_path, env=env, capture_output=True
    )
    assert submitted.returncode == 0, submitted.stderr
    worker = subprocess.Popen(
        [*cli, "worker", "--log-json", "--isolation", "task", "--sweep-interval", "0.1",
         "--blocked-loop-after", "0.5"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines: list[dict[str, object]] = []
    try:
        assert worker.stderr is not None
        deadline = time.monotonic() + STARTUP_S
        for raw in worker.stderr:  # ends when the worker closes stderr (it exits)
            lines.append(orjson.loads(raw))
            if lines[-1]["event"] == "loop_resumed" or time.monotonic() > deadline:
                break
    finally:
        worker.terminate()
        worker.wait(60)
        assert worker.stderr is not None
        worker.stderr.close()
    events = [line["event"] for line in lines]
    assert "loop_blocked" in events and events[-1] == "loop_resumed", lines
    blocked = next(line for line in lines if line["event"] == "loop_blocked")
    assert blocked["level"] == "WARNING", blocked
    assert "sleepy_llm.py" in str(blocked["detail"]) and "time.sleep(3)" in str(blocked["detail"])
