"""The termination ladder for a stuck child process: SIGTERM → grace → SIGKILL → reap → audit.

When a job running in a child process stalls, is cancelled or loses its lease, the owner
(the worker's parent process) first takes a :func:`snapshot_child` (the stacks and
figures, see :mod:`ai_lease.run.isolation.evidence`), then calls :func:`terminate`: ``SIGTERM``
lets the child's handler (:func:`install_child_handlers`) cancel its pipeline, run the
cleanup hooks and close its connections; a child still there after ``grace`` seconds is
``SIGKILL``-ed and reaped. :func:`audit` then checks the kill left nothing behind: the
``/proc`` entry gone, no descriptor or socket left, the registered temp paths removed.

>>> snap = await snapshot_child(pid, dump_path)                       # doctest: +SKIP
>>> outcome = await terminate(pid, grace=10, on_step=report)          # doctest: +SKIP
>>> facts = audit(pid, registered=[tmp_dir], hooks_ran=outcome == "term")  # doctest: +SKIP

On Linux the ladder holds a pidfd (``os.pidfd_open``): signals cannot hit a recycled pid
and the exit is awaited on the event loop, not polled; elsewhere it polls (5 → 100 ms).
Each step can become a job event with :func:`step_event` (kinds ``terminated`` with
``attrs["signal"]`` and ``reaped``), which :class:`~ai_lease.observe.metrics.Metrics`
counts as ``owner_terminated_total{signal}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ai_lease.lease.events import Event
from ai_lease.run.isolation.evidence import (
    PROC_ROOT,
    ChildSnapshot,
    cpu_seconds,
    install_child_handlers,
    snapshot_child,
)

__all__ = [
    "MAX_GRACE_S",
    "ChildSnapshot",
    "audit",
    "cpu_seconds",
    "install_child_handlers",
    "snapshot_child",
    "step_event",
    "terminate",
]

MAX_GRACE_S = 300.0
KILL_WAIT_S = 5.0  # how long a SIGKILL-ed child may take to go (it may be in a D state)

_log = logging.getLogger("ai_lease.ladder")
StepSink = Callable[[str, dict[str, Any]], None]


class _Child:
    """A handle on process ``pid``: a pidfd where the OS has them, else the bare pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.fd = os.pidfd_open(pid)  # ProcessLookupError (an OSError): gone already

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig``; False if the process is gone."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def exited(self) -> bool:
        """Whether the process has ended (a zombie not yet reaped counts as ended)."""
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], 0)[0])
        return _exited(self.pid)

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the process to end; whether it did."""
        if self.exited():
            return True
        if self.fd is None:
            return await _poll_exit(self.pid, timeout)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        loop.add_reader(self.fd, _settle, done)
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            return self.exited()
        finally:
            loop.remove_reader(self.fd)
        return True


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


def _exited(pid: int) -> bool:
    """Ended, without reaping it: ``waitid(WNOWAIT)`` for a child of ours, else ``/proc``."""
    try:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return found is not None
    except ChildProcessError:
        pass  # not our child (or reaped already)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(os.path.join(PROC_ROOT, str(pid), "stat"), encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


async def _poll_exit(pid: int, timeout: float) -> bool:
    deadline, pause = time.monotonic() + timeout, 0.005
    while not _exited(pid):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, 0.1)
    return True


async def terminate(
    pid: int,
    *,
    grace: float,
    on_step: StepSink | None = None,
    reap: Callable[[], Awaitable[int | None]] | None = None,
) -> str:
    """SIGTERM ``pid``, wait up to ``grace`` seconds for it to exit, then SIGKILL; reap it.

    Returns ``"exited"`` (gone before any signal), ``"term"`` (exited within the grace) or
    ``"kill"``. A child that exits at once is not waited for. ``on_step`` gets
    ``("term" | "kill" | "reaped", facts)`` as each happens (facts: pid, grace_s,
    elapsed_s, exit_code where known; see :func:`step_event`). ``reap`` is the owner's way
    to collect the exit status (``Popen.wait``, ``Process.join``…); without it a child of
    this process is reaped with ``waitpid``. Never raises for an already-gone pid.
    """
    _check(pid, grace)
    child, started = _Child(pid), time.monotonic()
    try:
        outcome = await _ladder(child, grace, started, _guarded(on_step))
    finally:
        child.close()
    code = await _reap(pid, reap)
    facts: dict[str, Any] = {"pid": pid, "outcome": outcome, "elapsed_s": _since(started)}
    if code is not None:
        facts["exit_code"] = code
    _guarded(on_step)("reaped", facts)
    return outcome


def _check(pid: int, grace: float) -> None:
    if pid <= 0 or pid == os.getpid():
        raise ValueError(f"terminate: pid {pid} is not a child process: pass the child's pid")
    if not 0 <= grace <= MAX_GRACE_S:
        raise ValueError(f"terminate: grace {grace!r} s is outside 0–{MAX_GRACE_S:g} s")


async def _ladder(child: _Child, grace: float, started: float, on_step: StepSink) -> str:
    if child.exited() or not child.signal(signal.SIGTERM):
        return "exited"
    on_step("term", {"pid": child.pid, "signal": "term", "grace_s": grace})
    if await child.wait(grace):
        return "term"
    if child.signal(signal.SIGKILL):
        on_step("kill", {"pid": child.pid, "signal": "kill", "elapsed_s": _since(started)})
        await child.wait(KILL_WAIT_S)
    return "kill"


async def _reap(pid: int, reap: Callable[[], Awaitable[int | None]] | None) -> int | None:
    """The exit status: from the owner's ``reap``, or ``waitpid`` for a child of ours."""
    if reap is not None:
        try:
            return await reap()
        except (ChildProcessError, ProcessLookupError):
            return None
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        try:
            found, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
        except ChildProcessError:
            return None  # not ours, or reaped by its owner already
        if found:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.01)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def _guarded(on_step: StepSink | None) -> StepSink:
    """``on_step``, made safe: a failing sink is logged and never stops the ladder halfway
    (a child left unkilled is worse than a missing event)."""

    def step(name: str, facts: dict[str, Any]) -> None:
        if on_step is None:
            return
        try:
            on_step(name, facts)
        except Exception:
            _log.exception("ladder step %s for pid %s: on_step failed", name, facts.get("pid"))

    return step


def step_event(key: str, step: str, facts: dict[str, Any], **ids: Any) -> Event:
    """The job event for one ladder step: ``terminated`` (``attrs["signal"]`` ``"term"`` or
    ``"kill"``) for a signal sent, ``reaped`` for the child collected.

    >>> step_event("job-1", "kill", {"pid": 42, "signal": "kill", "elapsed_s": 10.0}).kind
    'terminated'

    ``ids`` are passed to :class:`Event` (``owner_id``, ``token``, ``stage``).
    """
    kind = "reaped" if step == "reaped" else "terminated"
    attrs = {k: v for k, v in facts.items() if isinstance(v, int | float | str)}
    if kind == "terminated":
        attrs["signal"] = step
    detail = str(facts.get("outcome", step))
    return Event(kind, key, detail=detail, attrs=attrs, **ids)


def audit(
    pid: int,
    *,
    registered: Sequence[str] = (),
    hooks_ran: bool | None = None,
    sockets: Sequence[int] = (),
    proc_root: str = PROC_ROOT,
) -> dict[str, Any]:
    """After the kill: what the child left behind, fixed where the parent can, as facts.

    ``proc_gone``: ``/proc/<pid>`` is gone (``"unavailable"`` without ``/proc``);
    ``fds_left``: descriptors still open in it; ``sockets_left``: which of ``sockets``
    (a snapshot's ``socket_inodes``) are still open anywhere (``/proc/net``);
    ``paths``: per registered temp path ``"removed"`` (by the child), ``"removed by
    audit"`` (left behind: the parent removed it) or the error; ``hooks``: ``"ran"``,
    ``"skipped"`` or ``"unknown"``; ``clean``: nothing was left but what the audit removed.
    """
    have_proc = os.path.isdir(os.path.join(proc_root, "self")) or os.path.isdir(
        os.path.join(proc_root, "net")
    )
    base = os.path.join(proc_root, str(pid))
    gone: bool | str = not os.path.exists(base) if have_proc else _unseen(pid)
    fds_left = _count(os.path.join(base, "fd")) if have_proc else None
    left = _sockets_left(sockets, proc_root) if have_proc else []
    paths = {path: _remove(path) for path in registered}
    hooks = {True: "ran", False: "skipped", None: "unknown"}[hooks_ran]
    clean = gone is not False and not fds_left and not left
    clean = clean and all(s.startswith("removed") for s in paths.values())
    return {
        "pid": pid,
        "proc_gone": gone,
        "fds_left": fds_left,
        "sockets_left": left,
        "paths": paths,
        "hooks": hooks,
        "clean": clean,
    }


def _unseen(pid: int) -> bool | str:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return "unavailable"
    return False


def _count(fd_dir: str) -> int:
    try:
        return len(os.listdir(fd_dir))
    except OSError:
        return 0  # no such process (or a zombie's fd table, already closed)


def _sockets_left(inodes: Sequence[int], proc_root: str) -> list[int]:
    """Which of ``inodes`` still appear in ``/proc/net``'s socket tables."""
    if not inodes:
        return []
    wanted, seen = {str(i) for i in inodes}, set[str]()
    for table in ("tcp", "tcp6", "udp", "udp6", "unix"):
        try:
            with open(os.path.join(proc_root, "net", table), encoding="utf-8") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        column = 6 if table == "unix" else 9
        seen.update(cols[column] for cols in map(str.split, rows) if len(cols) > column)
    return sorted(int(i) for i in wanted & seen)


def _remove(path: str) -> str:
    if not os.path.lexists(path):
        return "removed"
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except OSError as exc:
        return f"left: could not remove ({exc.strerror or exc}): remove it by hand"
    return "removed by audit"
