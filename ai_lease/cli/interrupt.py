"""How a foreground command ends on SIGINT or SIGTERM: it unwinds (a running job's lease is
released), says so in one line and exits 130 — never a traceback.

>>> async with cancelled_by_signals() as caught:        # doctest: +SKIP
...     try:
...         await work()
...     except asyncio.CancelledError:
...         caught.check()          # re-raises unless a signal did it: then Interrupted
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import Job

__all__ = ["Caught", "Interrupted", "cancelled_by_signals", "hand_back"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """A command was stopped by ``signal`` (its name); ``detail`` says what was left how."""

    def __init__(self, signal_name: str, detail: str = "") -> None:
        self.signal_name, self.detail = signal_name, detail
        super().__init__(f"interrupted ({signal_name})" + (f": {detail}" if detail else ""))


class Caught:
    """The first signal a :func:`cancelled_by_signals` block received (None: none yet)."""

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.name: str | None = None
        self._task = task

    def on_signal(self, sig: signal.Signals) -> None:
        if self.name is None and self._task is not None:  # a second signal: already stopping
            self.name = sig.name
            self._task.cancel()

    def check(self) -> str:
        """In an ``except CancelledError``: the signal's name (the task may go on awaiting,
        e.g. to hand its job back), or the CancelledError again if no signal caused it."""
        if self.name is None or self._task is None:
            raise asyncio.CancelledError
        self._task.uncancel()
        return self.name


@contextlib.asynccontextmanager
async def cancelled_by_signals() -> AsyncIterator[Caught]:
    """While the block runs, the first SIGINT or SIGTERM cancels the task running it; later
    ones are ignored (the block is handing its work back, within the store's bounds)."""
    loop = asyncio.get_running_loop()
    caught = Caught(asyncio.current_task())
    installed = []
    for sig in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, caught.on_signal, sig)
            installed.append(sig)
    try:
        yield caught
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def hand_back(client: Client, job: Job, *, cancel: bool) -> str:
    """After an interrupt (the lease already released as the run unwound): cancel the job,
    or leave it to workers (its spec stored, its queue entry due now). What was done."""
    from ai_lease.errors import AiLeaseError

    key = job.key
    try:
        async with asyncio.timeout(4 * client.timings.op_timeout):
            if cancel:
                record = await client.cancel(key, "interrupted: submit --cancel-on-interrupt")
            else:
                record = await client.submit(job)
    except (AiLeaseError, TimeoutError) as exc:
        return f"job {key!r} not handed over ({exc}); its lease lapses on its own"
    if record is not None and record.status.value != ("CANCELLED" if cancel else "PENDING"):
        return f"job {key!r} is {record.status.value}"
    if cancel:
        return f"job {key!r} cancelled"
    return f"job {key!r} left to workers (spec stored, due now)"
