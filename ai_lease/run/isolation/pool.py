"""The warm children of process isolation: started once, taken per job, replaced when
stopped (see :mod:`ai_lease.run.isolation`)."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.run.isolation.child import ChildSpec, child_main
from ai_lease.run.isolation.env import only_allowed

__all__ = ["Child", "ChildPool", "receive", "start_fork_server"]

START_TIMEOUT_S = 60.0
"""Seconds a new child may take to import ai_lease and build its provider."""


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """SIGINT blocked on this thread meanwhile, so that a process started here inherits it
    blocked; a Ctrl-C that comes meanwhile reaches this process afterwards, not lost."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def start_fork_server(env_keep: tuple[str, ...] = ()) -> None:
    """Start multiprocessing's fork server (if it is not running) with the allowed environment
    (the server's environ is its children's) and deaf to Ctrl-C from its first instruction.

    A Ctrl-C reaches the worker's whole process group. multiprocessing has its server ignore
    SIGINT only once the server has imported its preload, and that import takes a second or
    more on a busy machine: a Ctrl-C soon after `ai-lease worker --isolation process` started
    used to end the server with a KeyboardInterrupt traceback on the worker's stderr (JSON
    logs or not). The worker drains and stops its children itself; they ignore SIGINT too."""
    from multiprocessing import forkserver, resource_tracker

    with only_allowed(env_keep):
        # The server starts the resource tracker first if it is not running, and that start
        # unblocks SIGINT on its way out (CPython's fix of the same race for the tracker,
        # bpo-33613): started here beforehand, it is found running and the mask stays.
        resource_tracker.ensure_running()
        with _ctrl_c_held():
            forkserver.ensure_running()


@dataclass
class Child:
    """One warm child: its process, its pipe, its shared progress array, its dump file."""

    process: BaseProcess
    conn: Connection
    shared: Any
    dump_path: str

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


class ChildPool:
    """``size`` warm children built from ``spec``; :meth:`take` one per job."""

    def __init__(self, spec: ChildSpec, size: int, *, method: str | None = None) -> None:
        self.spec, self.size = spec, size
        method = method or ("forkserver" if sys.platform.startswith("linux") else "spawn")
        self.mp = multiprocessing.get_context(method)
        if method == "forkserver":  # the server dies with this process (see the module)
            self.mp.set_forkserver_preload(["ai_lease.run.isolation.forkserver"])
        self._idle: asyncio.Queue[Child] = asyncio.Queue()
        self.children: dict[int, Child] = {}  # pid → child, idle or busy
        self._dumps = tempfile.TemporaryDirectory(prefix="ai-lease-children-")
        self.started = 0  # children started over the pool's life (replacements included)

    async def start(self) -> None:
        """Start every child and wait until each is ready. The fork server is started
        here, on this thread: the kernel's parent-death signal it asks for follows the
        thread that started it (a pool thread of ``to_thread`` could end first)."""
        if self.mp.get_start_method() == "forkserver":
            start_fork_server(self.spec.env_keep)
        children = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        for child in children:
            self._idle.put_nowait(child)

    def _start(self, process: BaseProcess) -> None:
        """Start ``process``: forked by the fork server (whose environment is already the
        allowed one), or spawned here with only the allowed environment."""
        if self.mp.get_start_method() == "forkserver":
            process.start()
            return
        with only_allowed(self.spec.env_keep):
            process.start()

    async def _spawn(self) -> Child:
        """One new child, ready (it has imported ai_lease and built its provider)."""
        parent_end, child_end = self.mp.Pipe()
        shared = self.mp.RawArray("d", 3)
        self.started += 1
        dump = os.path.join(self._dumps.name, f"child-{os.getpid()}-{self.started}.txt")
        process = self.mp.Process(  # type: ignore[attr-defined]
            target=child_main,
            args=(child_end, self.spec, shared, dump),
            name=f"ai-lease child {self.started}",
            daemon=True,
        )
        await asyncio.to_thread(self._start, process)
        child_end.close()
        child = Child(process, parent_end, shared, dump)
        self.children[child.pid] = child
        try:
            message = await receive(child, timeout=START_TIMEOUT_S)
        except (ProviderError, TimeoutError):
            process.kill()
            raise ConfigError(
                f"child process {child.pid} did not start (exit code {process.exitcode}): "
                "see its error above; a script that starts a process worker needs "
                "`if __name__ == '__main__':` (multiprocessing's forkserver/spawn rule)"
            ) from None
        assert message[0] == "ready", message
        return child

    async def take(self) -> Child:
        """An idle child (waits while every child is busy)."""
        return await self._idle.get()

    def give_back(self, child: Child) -> None:
        self._idle.put_nowait(child)

    async def replace(self, child: Child) -> None:
        """Forget ``child`` (stopped) and put a fresh one in its place."""
        self.children.pop(child.pid, None)
        child.conn.close()
        await asyncio.to_thread(child.process.join, 5.0)
        self.give_back(await self._spawn())

    def idle_count(self) -> int:
        return self._idle.qsize()

    async def aclose(self) -> None:
        """Close every pipe (the children exit), then reap them; stragglers are killed."""
        children = list(self.children.values())
        self.children.clear()
        for child in children:
            child.conn.close()
        for child in children:
            await asyncio.to_thread(child.process.join, 5.0)
            if child.process.is_alive():
                child.process.kill()
                await asyncio.to_thread(child.process.join, 5.0)
        self._dumps.cleanup()


async def receive(child: Child, timeout: float | None = None) -> tuple[Any, ...]:
    """The child's next message; EOF (the child died) raises a retryable ProviderError."""
    loop = asyncio.get_running_loop()
    fd = child.conn.fileno()
    if not child.conn.poll():
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _set_once, readable)
        try:
            async with asyncio.timeout(timeout):
                await readable
        finally:
            loop.remove_reader(fd)
    try:
        message = pickle.loads(child.conn.recv_bytes())
    except (EOFError, OSError):
        code = child.process.exitcode
        raise ProviderError(
            f"the job's child process {child.pid} ended (exit code {code}) before it answered",
            retryable=True,
        ) from None
    assert isinstance(message, tuple)
    return message


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
