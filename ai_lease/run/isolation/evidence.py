"""Evidence from a stuck child process: every thread's stack and its resource figures.

The child calls :func:`install_child_handlers` once at start; from then on the parent can
ask for a stack dump with ``SIGUSR2``. The dump is written by :mod:`faulthandler` from its
C-level signal handler, so it works while the child's event loop, or a C call holding the
GIL (``time.sleep``, ``socket.recv``, a regex), is stuck. :func:`snapshot_child` sends the
signal, waits (bounded) for the dump to land in the file, and adds figures from
``/proc/<pid>``: RSS, CPU time, ``cpu_idle_pct`` (the seed's "CPU < 5 % and no progress":
a stuck wait idles, slow work burns CPU), open descriptors, sockets, threads. Where there is
no ``/proc`` (macOS, Windows) the figures are ``None`` and render as "unavailable".

>>> install_child_handlers("/tmp/job-1.dump", on_terminate=cancel_pipeline)  # doctest: +SKIP
>>> snap = await snapshot_child(child_pid, "/tmp/job-1.dump")                 # doctest: +SKIP
>>> record_stall(snap.render())                                               # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

__all__ = [
    "END_OF_DUMP",
    "PROC_ROOT",
    "ChildSnapshot",
    "cpu_seconds",
    "install_child_handlers",
    "read_figures",
    "snapshot_child",
]

PROC_ROOT = "/proc"
MAX_DUMP_BYTES = 256 * 1024  # read at most this much of one dump
MAX_TASKS = 20  # asyncio tasks shown per dump
TASKS_WAIT_S = 0.5  # how long the tasks section may lag the faulthandler dump
# The dump file starts with TASKS_HEADER when each dump ends with an asyncio section.
TASKS_HEADER = b"# ai_lease child dump: each stack dump ends with the asyncio tasks\n"
END_OF_DUMP = b"# end of dump\n"
_UNAVAILABLE = "unavailable"
# The open dump file: faulthandler writes to its descriptor, so it must stay open.
_dump_file: IO[bytes] | None = None


# -- in the child ---------------------------------------------------------------------------------


def install_child_handlers(
    dump_path: str, on_terminate: Callable[[], None] | None = None, *, tasks: bool = True
) -> None:
    """In a child process, at start: stack dumps on ``SIGUSR2``, cleanup on ``SIGTERM``.

    ``SIGUSR2`` makes :mod:`faulthandler` append every thread's stack to ``dump_path``
    (from C, so it works while anything is stuck). With ``tasks`` (the default) a Python
    handler then appends the await chain of each asyncio task of the loop running in the
    main thread, ending with :data:`END_OF_DUMP`; it only runs when the main thread runs
    Python code, so a missing section is itself evidence (the loop is stuck in a C call).
    Nothing else in the child may take ``SIGUSR2`` over; use one dump file per child.
    ``SIGTERM`` calls ``on_terminate`` once, in the main thread, from Python's signal
    handler (between two bytecodes of whatever the main thread runs): it should only do
    what is safe there (set a flag, ``loop.call_soon_threadsafe(task.cancel)``, run short
    cleanup hooks, ``sys.exit``). ``SystemExit`` it raises propagates (that is how it ends
    the child); any other error is written to the dump file and stderr, never raised into
    the interrupted code. A second ``SIGTERM`` is ignored. Without ``on_terminate`` the
    child exits with status 143 via ``SystemExit`` (so ``finally`` blocks run).
    Must be called from the main thread (``signal.signal`` requires it).
    """
    global _dump_file
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "install_child_handlers must run in the child's main thread "
            "(signal handlers can only be set there): call it before starting threads"
        )
    if _dump_file is not None:
        faulthandler.unregister(signal.SIGUSR2)
        _dump_file.close()
    _dump_file = open(dump_path, "ab", buffering=0)  # must outlive this call
    if tasks:  # faulthandler dumps first, then chains to the Python handler below
        if _dump_file.tell() == 0:  # one dump file per child process: say it once
            _dump_file.write(TASKS_HEADER)
        signal.signal(signal.SIGUSR2, _tasks_handler)
    faulthandler.register(signal.SIGUSR2, file=_dump_file, all_threads=True, chain=tasks)
    signal.signal(signal.SIGTERM, _term_handler(on_terminate))


def _term_handler(on_terminate: Callable[[], None] | None) -> Callable[[int, Any], None]:
    fired = False

    def handle(signum: int, frame: Any) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        if on_terminate is None:
            raise SystemExit(128 + signal.SIGTERM)
        try:
            on_terminate()
        except Exception:
            _report(f"on_terminate failed:\n{traceback.format_exc()}")

    return handle


def _tasks_handler(signum: int, frame: Any) -> None:
    """Append the await chains of the main thread's running loop's tasks, then the end."""
    try:
        text = _tasks_text()
    except Exception as exc:  # diagnostics must never break the child
        text = f"asyncio tasks: unavailable ({exc!r})\n"
    if _dump_file is not None:
        with contextlib.suppress(OSError):
            _dump_file.write(text.encode("utf-8", "replace") + END_OF_DUMP)


def _tasks_text() -> str:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return "asyncio tasks: no event loop running in the main thread\n"
    from ai_lease.lease.snapshot import snapshot  # only when asked: keep start-up light

    found = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    parts = [f"asyncio tasks ({len(found)}, await chain innermost last):"]
    for task in found[:MAX_TASKS]:
        parts.append(snapshot(task, None, f"task {task.get_name()}"))
    if len(found) > MAX_TASKS:
        parts.append(f"… and {len(found) - MAX_TASKS} more tasks")
    return "\n".join(parts) + "\n"


def _report(text: str) -> None:
    """Write ``text`` to the dump file (the parent reads it) and to stderr."""
    data = text.encode("utf-8", "replace")
    if _dump_file is not None:
        try:
            _dump_file.write(data)
        except OSError:
            pass
    sys.stderr.write(text)


# -- in the parent --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildSnapshot:
    """Where a stuck child is stuck: the stacks of all its threads, and its figures.

    A figure is ``None`` where it could not be read (no ``/proc``, the child is gone).
    ``socket_inodes`` are the inodes of its sockets, for
    :func:`~ai_lease.run.isolation.ladder.audit` to check they were released after the kill.
    """

    stacks: str
    rss_bytes: int | None
    cpu_s: float | None
    cpu_idle_pct: float | None
    open_fds: int | None
    sockets: int | None
    threads: int | None
    socket_inodes: tuple[int, ...] = ()

    def render(self, limit: int = 64 * 1024) -> str:
        """Bounded text for ``JobState.stall_snapshot``: threads, the stacks, the figures.

        The figures always fit: the stacks are cut (saying so) to leave room for them.

        >>> print(ChildSnapshot("", None, None, None, None, None, None).render())
        threads: unavailable
        <no stack dump>
        rss: unavailable
        cpu_s: unavailable
        cpu_idle_pct: unavailable
        open_fds: unavailable
        sockets: unavailable
        """
        head = f"threads: {_shown(self.threads)}\n"
        tail = (
            f"rss: {_shown(self.rss_bytes, ' bytes')}\n"
            f"cpu_s: {_shown(self.cpu_s, '', '.2f')}\n"
            f"cpu_idle_pct: {_shown(self.cpu_idle_pct, '', '.1f')}\n"
            f"open_fds: {_shown(self.open_fds)}\n"
            f"sockets: {_shown(self.sockets)}"
        )
        stacks = self.stacks.strip() or "<no stack dump>"
        room = max(0, limit - len(head) - len(tail) - 1)
        if len(stacks) > room:
            cut = "\n… (stacks cut)"
            stacks = stacks[: max(0, room - len(cut))] + cut
        return (head + stacks + "\n" + tail)[:limit]


def _shown(value: float | None, unit: str = "", spec: str = "") -> str:
    return _UNAVAILABLE if value is None else f"{value:{spec}}{unit}"


async def snapshot_child(
    pid: int,
    dump_path: str,
    *,
    since_progress_cpu_s: float | None = None,
    since_progress_s: float | None = None,
    timeout: float = 1.0,
    proc_root: str = PROC_ROOT,
) -> ChildSnapshot:
    """``SIGUSR2`` the child, read the stack dump it writes, and read its ``/proc`` figures.

    Waits at most ``timeout`` seconds for the dump to appear and stop growing; a child gone
    or not answering gives a ``stacks`` text that says so. ``since_progress_cpu_s`` is the
    child's CPU time (:func:`cpu_seconds`) at its last progress and ``since_progress_s``
    the wall seconds since then: ``cpu_idle_pct = 100 * (1 - cpu used / wall)``, near 100
    for a stuck wait, near 0 for a busy loop. Without ``since_progress_s`` the window is
    the child's whole life. Never raises for a gone pid.
    """
    stacks = await _dump_stacks(pid, dump_path, timeout, proc_root)
    figures = read_figures(pid, proc_root=proc_root)
    idle = _idle_pct(pid, figures.get("cpu_s"), since_progress_cpu_s, since_progress_s, proc_root)
    return ChildSnapshot(stacks=stacks, cpu_idle_pct=idle, **figures)


async def _dump_stacks(pid: int, dump_path: str, timeout: float, proc_root: str) -> str:
    """Ask ``pid`` for its stack dump; the dump, or a text saying why there is none."""
    if _catches(pid, signal.SIGUSR2, proc_root) is False:
        # SIGUSR2's default action ends the process: never send it to a child without
        # the handler (install_child_handlers not called, or not yet).
        return f"<no stack dump: process {pid} has no SIGUSR2 handler (install_child_handlers)>"
    start = _size(dump_path)
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        return f"<no stack dump: process {pid} is gone>"
    except PermissionError:
        return f"<no stack dump: not allowed to signal process {pid}>"
    return _without_marker(await _await_dump(dump_path, start, timeout))


def _catches(pid: int, sig: signal.Signals, proc_root: str) -> bool | None:
    """Whether ``pid`` has a handler for ``sig`` (``SigCgt`` in its status; None: unknown)."""
    mask = _status(os.path.join(proc_root, str(pid))).get("SigCgt", "").strip()
    try:
        return bool(int(mask, 16) >> (sig - 1) & 1)
    except ValueError:
        return None


async def _await_dump(path: str, start: int, timeout: float) -> str:
    """The dump appended to ``path`` past ``start``, once complete (bounded by ``timeout``).

    Complete means: it ends with :data:`END_OF_DUMP` where the file says a tasks section
    follows each dump (waited for at most ``TASKS_WAIT_S`` past the stacks), else that it
    grew and then stayed the same for one poll (faulthandler writes it in one go).
    """
    deadline = time.monotonic() + timeout
    tasks, seen, stable_at = _has_tasks(path), start, None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        size = _size(path)
        if size < start:
            start = seen = 0  # the file was truncated or replaced: read it from its start
        elif size > start and size == seen:
            if not tasks or _read_from(path, start).endswith(END_OF_DUMP.decode()):
                break
            stable_at = stable_at or time.monotonic()
            if time.monotonic() - stable_at >= TASKS_WAIT_S:
                return _read_from(path, start) + _NO_TASKS
        seen = size
    if _size(path) <= start:
        return f"<no stack dump within {timeout:g} s: the child did not answer SIGUSR2>"
    text = _read_from(path, start)
    return text if not tasks or text.endswith(END_OF_DUMP.decode()) else text + _NO_TASKS


def _without_marker(text: str) -> str:
    return text.replace(END_OF_DUMP.decode(), "")


_NO_TASKS = "asyncio tasks: no answer (the main thread ran no Python code: stuck in a C call?)\n"


def _has_tasks(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(TASKS_HEADER)) == TASKS_HEADER
    except OSError:
        return False


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(MAX_DUMP_BYTES)
    if offset == 0 and data.startswith(TASKS_HEADER):
        data = data[len(TASKS_HEADER) :]
    return data.decode("utf-8", "replace")


def read_figures(pid: int, *, proc_root: str = PROC_ROOT) -> dict[str, Any]:
    """``rss_bytes``, ``cpu_s``, ``open_fds``, ``sockets``, ``socket_inodes``, ``threads``
    of ``pid`` from ``proc_root`` (``None`` each where it cannot be read)."""
    base = os.path.join(proc_root, str(pid))
    status = _status(base)
    rss_kb = status.get("VmRSS", "").split()[:1]
    threads = status.get("Threads", "").strip()
    inodes, fds = _fds(base)
    return {
        "rss_bytes": int(rss_kb[0]) * 1024 if rss_kb and rss_kb[0].isdigit() else None,
        "cpu_s": cpu_seconds(pid, proc_root=proc_root),
        "open_fds": fds,
        "sockets": None if fds is None else len(inodes),
        "socket_inodes": tuple(inodes),
        "threads": int(threads) if threads.isdigit() else None,
    }


def _status(base: str) -> dict[str, str]:
    try:
        with open(os.path.join(base, "status"), encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    return dict(line.split(":", 1) for line in lines if ":" in line)


def _fds(base: str) -> tuple[list[int], int | None]:
    """The socket inodes among ``base``'s descriptors, and the number of descriptors."""
    fd_dir = os.path.join(base, "fd")
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return [], None
    inodes = []
    for name in names:
        try:
            link = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue  # closed while we looked
        if link.startswith("socket:[") and link.endswith("]"):
            inodes.append(int(link[8:-1]))
    return inodes, len(names)


def _stat_fields(pid: int, proc_root: str) -> list[str] | None:
    """Fields 3… of ``/proc/<pid>/stat`` (after the command name, which may hold spaces)."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def cpu_seconds(pid: int, *, proc_root: str = PROC_ROOT) -> float | None:
    """User + system CPU seconds ``pid`` has used (``None`` without ``/proc``).

    Take it at each progress mark (or sample it) to pass as ``since_progress_cpu_s``.
    """
    fields = _stat_fields(pid, proc_root)
    if fields is None or len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _age_s(pid: int, proc_root: str) -> float | None:
    """Seconds since ``pid`` started (``/proc/<pid>/stat`` starttime against uptime)."""
    fields = _stat_fields(pid, proc_root)
    try:
        with open(os.path.join(proc_root, "uptime"), encoding="utf-8") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if fields is None or len(fields) < 20:
        return None
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _idle_pct(
    pid: int, cpu_s: float | None, cpu_at: float | None, wall: float | None, proc_root: str
) -> float | None:
    if cpu_s is None:
        return None
    if wall is None:
        wall, cpu_at = _age_s(pid, proc_root), 0.0
    if wall is None or wall <= 0:
        return None
    used = cpu_s - (cpu_at or 0.0)
    return max(0.0, min(100.0, 100.0 * (1.0 - used / wall)))
