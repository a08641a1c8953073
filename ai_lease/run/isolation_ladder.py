"""The termination ladder's calls as process isolation uses them: ``ai_lease.run.ladder``
when it is installed, else a minimal stand-in with the same names (a ``faulthandler`` dump
on SIGUSR1, SIGTERM → grace → SIGKILL, a ``/proc`` check).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["audit", "install_child_handlers", "snapshot_child", "terminate"]

try:  # the real ladder (ai_lease/run/ladder.py), once it is there
    from ai_lease.run.ladder import (  # type: ignore[import-not-found,unused-ignore]
        audit,
        install_child_handlers,
        snapshot_child,
        terminate,
    )
except ImportError:  # pragma: no cover - replaced by the ladder module when merged
    _DUMP_CHARS = 8_000

    def install_child_handlers(  # type: ignore[misc,unused-ignore]
        dump_path: str, on_terminate: Callable[[], None] | None = None
    ) -> None:
        """SIGUSR1 dumps every thread's stack to ``dump_path``; SIGTERM runs
        ``on_terminate`` and exits 143 (from the main thread, between bytecodes)."""
        dump = open(dump_path, "w")
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True, chain=False)

        def on_term(signum: int, frame: Any) -> None:
            if on_terminate is not None:
                on_terminate()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)

    class _Snapshot:
        def __init__(self, text: str) -> None:
            self.text = text

        def render(self) -> str:
            return self.text[-_DUMP_CHARS:]

    async def snapshot_child(  # type: ignore[misc,unused-ignore]
        pid: int,
        dump_path: str,
        *,
        since_progress_cpu_s: float | None = None,
        since_progress_s: float | None = None,
        timeout: float = 1.0,
    ) -> _Snapshot:
        """Ask the child for its threads' stacks and read them (bounded wait)."""
        before = _size(dump_path)
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return _Snapshot(f"child {pid} is gone: no stacks")
        until, size = time.monotonic() + timeout, before
        while time.monotonic() < until:
            await asyncio.sleep(0.02)
            now = _size(dump_path)
            if now > before and now == size:  # written and no longer growing
                break
            size = now
        return _Snapshot(f"child process {pid}, every thread:\n" + _read_from(dump_path, before))

    def _size(path: str) -> int:
        return os.path.getsize(path) if os.path.exists(path) else 0

    def _read_from(path: str, offset: int) -> str:
        with open(path, errors="replace") as f:
            f.seek(offset)
            return f.read()

    async def terminate(  # type: ignore[misc,unused-ignore]
        pid: int,
        *,
        grace: float,
        on_step: Callable[[str], None] | None = None,
        reap: Callable[[], bool] | None = None,
    ) -> str:
        """SIGTERM, up to ``grace`` seconds for an exit, then SIGKILL."""
        gone = reap or (lambda: not Path(f"/proc/{pid}").exists())
        if gone():
            return "exited"
        for sig, how, wait in ((signal.SIGTERM, "term", grace), (signal.SIGKILL, "kill", 5.0)):
            if on_step is not None:
                on_step(how)
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return how
            until = time.monotonic() + wait
            while time.monotonic() < until:
                if gone():
                    return how
                await asyncio.sleep(0.01)
        return "kill"

    def audit(  # type: ignore[misc,unused-ignore]
        pid: int, *, registered: Any = (), hooks_ran: Any = None
    ) -> dict[str, Any]:
        """Whether the child's ``/proc`` entry is gone."""
        return {"pid": pid, "gone": not Path(f"/proc/{pid}").exists()}
