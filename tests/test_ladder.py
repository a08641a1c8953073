"""The termination ladder and child snapshots, against real stuck child processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ai_lease.observe.metrics import Metrics
from ai_lease.run.isolation.ladder import (
    ChildSnapshot,
    audit,
    cpu_seconds,
    install_child_handlers,
    snapshot_child,
    step_event,
    terminate,
)

REAL_TIME = "the ladder stops real stuck child processes"


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")
ROOT = Path(__file__).resolve().parents[1]

Spawn = Callable[..., tuple[subprocess.Popen[bytes], Path]]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start stuck children (tests/harness/stuck_child.py); kill any left at the end."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(mode: str, *flags: str) -> tuple[subprocess.Popen[bytes], Path]:
        workdir = tmp_path / f"{mode}-{len(procs)}"
        workdir.mkdir()
        cmd = [sys.executable, "-m", "tests.harness.stuck_child", mode, str(workdir), *flags]
        proc = subprocess.Popen(cmd, cwd=ROOT)
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not (workdir / "ready").exists():
            assert proc.poll() is None, f"stuck child {mode} died at start: {proc.returncode}"
            assert time.monotonic() < deadline, "stuck child not ready in 30 s"
            time.sleep(0.02)
        return proc, workdir

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _steps() -> tuple[list[str], Callable[[str, dict[str, Any]], None]]:
    seen: list[str] = []
    return seen, lambda step, facts: seen.append(step)


async def _snapshot_after(pid: int, workdir: Path, window: float) -> ChildSnapshot:
    """A snapshot with the CPU baseline taken ``window`` seconds before it."""
    cpu_at, started = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(window)
    return await snapshot_child(
        pid,
        str(workdir / "dump.txt"),
        since_progress_cpu_s=cpu_at,
        since_progress_s=time.monotonic() - started,
        timeout=5.0,
    )


async def test_snapshot_names_a_thread_stuck_in_sleep(spawn: Spawn) -> None:
    """A thread stuck in time.sleep is named in the dump; threads ≥ 2; the wait idles."""
    proc, workdir = spawn("sleep")
    snap = await _snapshot_after(proc.pid, workdir, 1.0)
    assert "in stuck_sleep" in snap.stacks and "stuck_child.py" in snap.stacks
    assert snap.threads is not None and snap.threads >= 2
    assert snap.sockets is not None and snap.sockets >= 2  # the socket pair
    assert snap.open_fds is not None and snap.open_fds >= 5
    assert snap.rss_bytes is not None and snap.rss_bytes > 1_000_000
    assert snap.cpu_idle_pct is not None and snap.cpu_idle_pct > 80
    text = snap.render()
    assert text.startswith("threads: ") and "stuck_sleep" in text and "cpu_idle_pct: " in text


async def test_snapshot_names_a_blocking_recv(spawn: Spawn) -> None:
    """The main thread blocked in socket.recv (no timeout) is named, with file and line."""
    proc, workdir = spawn("recv")
    snap = await _snapshot_after(proc.pid, workdir, 0.3)
    assert "in stuck_recv" in snap.stacks and 'stuck_child.py", line' in snap.stacks
    assert snap.sockets is not None and snap.sockets >= 1
    assert len(snap.socket_inodes) == snap.sockets


async def test_snapshot_shows_the_await_chain_when_the_loop_is_alive(spawn: Spawn) -> None:
    """A coroutine stuck awaiting on a live loop: the tasks section names it."""
    proc, workdir = spawn("await")
    snap = await snapshot_child(proc.pid, str(workdir / "dump.txt"), timeout=5.0)
    assert "asyncio tasks (1, " in snap.stacks and "in stuck_await" in snap.stacks
    assert "# end of dump" not in snap.stacks and "# ai_lease" not in snap.stacks


async def test_snapshot_of_a_busy_loop_shows_cpu_in_use(spawn: Spawn) -> None:
    """A busy loop holding the GIL is dumped all the same; it idles far less than a sleeper."""
    busy, busy_dir = spawn("busy")
    sleeper, sleeper_dir = spawn("sleep")
    # Side by side over the same window: on a loaded machine the busy child gets only a
    # share of a core, so compare the two rather than pin the busy one's figure.
    busy_snap, sleep_snap = await asyncio.gather(
        _snapshot_after(busy.pid, busy_dir, 1.5), _snapshot_after(sleeper.pid, sleeper_dir, 1.5)
    )
    assert "in stuck_busy" in busy_snap.stacks
    assert busy_snap.cpu_idle_pct is not None and sleep_snap.cpu_idle_pct is not None
    assert busy_snap.cpu_idle_pct < 90 and sleep_snap.cpu_idle_pct > 80
    assert sleep_snap.cpu_idle_pct - busy_snap.cpu_idle_pct > 20


async def test_second_snapshot_reads_only_the_new_dump(spawn: Spawn) -> None:
    """Each snapshot returns its own dump, not the dumps before it."""
    proc, workdir = spawn("recv")
    dump = str(workdir / "dump.txt")
    first = await snapshot_child(proc.pid, dump, timeout=5.0)
    second = await snapshot_child(proc.pid, dump, timeout=5.0)
    assert first.stacks.count("in stuck_recv") == 1 == second.stacks.count("in stuck_recv")


async def test_figures_are_unavailable_without_proc(spawn: Spawn, tmp_path: Path) -> None:
    """With no /proc (a proc root that is empty) figures say unavailable; stacks still come."""
    proc, workdir = spawn("recv")
    empty = tmp_path / "no-proc"
    empty.mkdir()
    snap = await snapshot_child(proc.pid, str(workdir / "dump.txt"), proc_root=str(empty))
    assert "stuck_recv" in snap.stacks
    figures = (snap.rss_bytes, snap.cpu_s, snap.cpu_idle_pct, snap.open_fds, snap.sockets)
    assert figures == (None,) * 5 and snap.threads is None
    text = snap.render()
    assert "threads: unavailable" in text and "sockets: unavailable" in text
    facts = audit(proc.pid, proc_root=str(empty))
    assert facts["proc_gone"] is False and facts["fds_left"] is None


def test_render_is_bounded_and_keeps_the_figures() -> None:
    """A huge dump is cut to the limit, saying so, and the figures survive the cut."""
    snap = ChildSnapshot("x" * 100_000, 5 << 20, 1.5, 97.0, 12, 3, 4)
    text = snap.render(limit=600)
    assert len(text) <= 600 and "stacks cut" in text
    assert text.startswith("threads: 4") and text.endswith("sockets: 3")
    assert "cpu_idle_pct: 97.0" in text and f"rss: {5 << 20} bytes" in text


async def test_snapshot_of_a_gone_pid_says_so(tmp_path: Path) -> None:
    """Snapshotting a process that is gone never raises: the text says it is gone."""
    pid = _dead_pid()
    snap = await snapshot_child(pid, str(tmp_path / "none.txt"))
    assert "is gone" in snap.stacks and snap.threads is None


async def test_snapshot_never_signals_a_child_without_the_handler(tmp_path: Path) -> None:
    """SIGUSR2 would end a child that never installed the handlers: it is not sent."""
    proc = _plain_child()
    try:
        snap = await snapshot_child(proc.pid, str(tmp_path / "dump.txt"))
        assert "no SIGUSR2 handler" in snap.stacks and proc.poll() is None
        assert snap.threads == 1
    finally:
        proc.kill()
        proc.wait()


def _plain_child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_child_that_honours_sigterm_runs_its_hook(spawn: Spawn) -> None:
    """SIGTERM runs the child's on_terminate (marker written) and it exits within the grace."""
    proc, workdir = spawn("recv")
    snap = await snapshot_child(proc.pid, str(workdir / "dump.txt"), timeout=5.0)
    steps, on_step = _steps()
    started = time.monotonic()
    assert await terminate(proc.pid, grace=30, on_step=on_step) == "term"
    assert time.monotonic() - started < 10  # not waited for: it left at once
    assert steps == ["term", "reaped"]
    assert (workdir / "terminated").read_text() == "recv"
    temp = str(workdir / "temp.txt")
    facts = audit(proc.pid, registered=[temp], hooks_ran=True, sockets=snap.socket_inodes)
    assert facts["proc_gone"] is True and facts["fds_left"] == 0
    assert facts["sockets_left"] == [] and facts["paths"] == {temp: "removed"}
    assert facts["hooks"] == "ran" and facts["clean"] is True


async def test_child_that_ignores_sigterm_is_killed_at_the_grace_end(spawn: Spawn) -> None:
    """SIG_IGN on SIGTERM: SIGKILL after the grace; audit removes the temp file it left."""
    proc, workdir = spawn("sleep", "--ignore-term")
    snap = await snapshot_child(proc.pid, str(workdir / "dump.txt"), timeout=5.0)
    seen: list[tuple[str, dict[str, Any]]] = []
    started = time.monotonic()
    outcome = await terminate(proc.pid, grace=0.5, on_step=lambda s, f: seen.append((s, f)))
    elapsed = time.monotonic() - started
    assert outcome == "kill" and 0.45 <= elapsed < 5
    assert [s for s, _ in seen] == ["term", "kill", "reaped"]
    assert seen[-1][1]["exit_code"] == -9
    assert not (workdir / "terminated").exists()
    temp = str(workdir / "temp.txt")
    facts = audit(proc.pid, registered=[temp], hooks_ran=False, sockets=snap.socket_inodes)
    assert facts["proc_gone"] is True and facts["sockets_left"] == []
    assert facts["paths"] == {temp: "removed by audit"} and not (workdir / "temp.txt").exists()
    assert facts["hooks"] == "skipped"


async def test_busy_child_is_terminated_and_reaped_by_its_owner(spawn: Spawn) -> None:
    """A busy child handles SIGTERM between bytecodes; the owner's reap gets its status."""
    proc, workdir = spawn("busy")

    async def reap() -> int | None:
        return await asyncio.to_thread(proc.wait)

    steps, on_step = _steps()
    assert await terminate(proc.pid, grace=30, on_step=on_step, reap=reap) == "term"
    assert proc.returncode == 0 and (workdir / "terminated").exists()
    assert steps == ["term", "reaped"]


async def test_child_stuck_in_a_c_call_is_dumped_then_killed(spawn: Spawn) -> None:
    """An endless C call holding the GIL: dumped anyway; SIGTERM cannot run, so SIGKILL."""
    proc, workdir = spawn("cloop")
    snap = await _snapshot_after(proc.pid, workdir, 0.5)
    assert "in stuck_c_loop" in snap.stacks and "asyncio tasks: no answer" in snap.stacks
    steps, on_step = _steps()
    assert await terminate(proc.pid, grace=0.5, on_step=on_step) == "kill"
    assert steps == ["term", "kill", "reaped"] and not (workdir / "terminated").exists()


async def test_a_failing_step_sink_never_stops_the_ladder(spawn: Spawn) -> None:
    """An on_step that raises does not stop the ladder: the child is killed all the same."""
    proc, _ = spawn("sleep", "--ignore-term")

    def broken(step: str, facts: dict[str, Any]) -> None:
        raise RuntimeError("sink down")

    assert await terminate(proc.pid, grace=0.3, on_step=broken) == "kill"
    assert audit(proc.pid)["proc_gone"] is True


async def test_an_already_dead_pid_has_exited() -> None:
    """A pid that is gone before any signal: "exited", no signal step, no error."""
    steps, on_step = _steps()
    assert await terminate(_dead_pid(), grace=5, on_step=on_step) == "exited"
    assert steps == ["reaped"]


async def test_bad_pid_or_grace_is_refused() -> None:
    """pid 0 (a process group), our own pid and a grace outside 0–300 s are refused."""
    for pid, grace in ((0, 1.0), (os.getpid(), 1.0), (12345, 301.0), (12345, -1.0)):
        with pytest.raises(ValueError, match="terminate"):
            await terminate(pid, grace=grace)


def test_steps_feed_owner_terminated_total() -> None:
    """term and kill steps become `terminated` events counted by signal."""
    metrics = Metrics()
    for step in ("term", "kill", "reaped"):
        metrics(step_event("job-1", step, {"pid": 7, "outcome": "kill", "exit_code": -9}))

    def count(sig: str) -> float | None:
        labels = {"pipeline": "default", "signal": sig}
        return metrics.registry.get_sample_value("owner_terminated_total", labels)

    assert (count("term"), count("kill")) == (1.0, 1.0)


def test_handlers_refuse_a_non_main_thread(tmp_path: Path) -> None:
    """install_child_handlers outside the main thread fails with a message, changing nothing."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            install_child_handlers(str(tmp_path / "dump.txt"))
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])
    assert not (tmp_path / "dump.txt").exists()


async def test_ladder_without_pidfd_polls(spawn: Spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the OS has no pidfd (macOS, old kernels) the same ladder works by polling."""
    monkeypatch.delattr(os, "pidfd_open")
    honours, _ = spawn("recv")
    ignores, _ = spawn("sleep", "--ignore-term")
    started = time.monotonic()
    assert await terminate(honours.pid, grace=30) == "term"
    assert time.monotonic() - started < 10
    started = time.monotonic()
    assert await terminate(ignores.pid, grace=0.5) == "kill"
    assert 0.45 <= time.monotonic() - started < 5
    assert audit(ignores.pid)["proc_gone"] is True
