"""The termination ladder's steps, written into the job's stored timeline as they happen.

The ladder (:mod:`ai_lease.run.isolation.ladder`) reports each step to a plain callback,
inside its own loop; the store's :meth:`~ai_lease.lease.timeline.JobNotes.note` is a round trip.
:func:`noting` joins the two: its sink only queues the step, and a writer task beside the
ladder (one task group: it never outlives the ladder) notes each one in turn, so the entry's
time is close to the step's and a slow store never holds a SIGKILL back. A store without
``note`` (a third-party one) is skipped; a note that fails or takes longer than
:data:`NOTE_WAIT_S` is logged and dropped: a missing entry is better than a child left
unkilled.

>>> async with noting(store, fence, "call_ai") as sink:                 # doctest: +SKIP
...     await ladder.terminate(pid, grace=10, on_step=sink)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ai_lease.lease.base import Fence
from ai_lease.run.isolation.ladder import StepSink

__all__ = ["NOTE_WAIT_S", "noting", "step_note"]

NOTE_WAIT_S = 5.0
"""Seconds one note may take before it is given up on (the ladder does not wait for it)."""

_log = logging.getLogger("ai_lease.ladder")
_Step = tuple[str, dict[str, Any]]


def step_note(step: str, facts: dict[str, Any]) -> tuple[str, str]:
    """A ladder step as a timeline entry's kind and detail; the detail of a ``terminated``
    entry starts with its signal (``term:`` or ``kill:``), a ``reaped`` one's with how the
    child ended (``exited``, ``term`` or ``kill``).

    >>> step_note("kill", {"pid": 42, "signal": "kill", "elapsed_s": 10.0})
    ('terminated', 'kill: SIGKILL to pid 42 after 10 s')
    """
    pid = facts.get("pid")
    if step == "term":
        return "terminated", f"term: SIGTERM to pid {pid}, grace {facts.get('grace_s', 0):g} s"
    if step == "kill":
        return "terminated", f"kill: SIGKILL to pid {pid} after {facts.get('elapsed_s', 0):g} s"
    code = facts.get("exit_code")
    ended = f", exit code {code}" if code is not None else ""
    how = facts.get("outcome", step)
    return "reaped", f"{how}: pid {pid} reaped after {facts.get('elapsed_s', 0):g} s{ended}"


@contextlib.asynccontextmanager
async def noting(store: object, fence: Fence, stage: str | None) -> AsyncIterator[StepSink]:
    """A step sink for :func:`~ai_lease.run.isolation.ladder.terminate` that notes each step in
    ``fence``'s job timeline (under the stopped owner's id and token), written by a task
    beside the block; on leaving, the notes queued are written (each bounded) first."""
    note = getattr(store, "note", None)
    if note is None:
        yield lambda step, facts: None
        return
    steps: asyncio.Queue[_Step | None] = asyncio.Queue()

    async def write() -> None:
        while (item := await steps.get()) is not None:
            kind, detail = step_note(*item)
            try:
                async with asyncio.timeout(NOTE_WAIT_S):
                    await note(
                        fence.key,
                        kind,
                        detail,
                        owner_id=fence.owner_id,
                        token=fence.token,
                        stage=stage,
                    )
            except Exception as exc:  # a missing entry must not stop the ladder
                _log.warning("ladder step %s for job %r not noted: %s", kind, fence.key, exc)

    async with asyncio.TaskGroup() as group:
        group.create_task(write())
        try:
            yield lambda step, facts: steps.put_nowait((step, dict(facts)))
        finally:
            steps.put_nowait(None)
