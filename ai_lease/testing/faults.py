"""Deterministic fault points, for tests: kill, pause or hang an owner at a named place.

The pipeline passes through named points — ``before:<stage>``, ``after:<stage>``,
``before_commit`` (after the owner's own lease check, just before the fenced write) and
``after_commit`` (after the write, before the runner returns). A :class:`FaultPlan` is a
fault hook (:data:`ai_lease.run.context.FaultHook`): installed as
``Runner(..., hooks=RunHooks(fault=plan))`` it acts at the points it names; without one,
each point is a no-op attribute check. Nothing here runs unless a test installs a plan.

>>> plan = FaultPlan({"before_commit": "pause"})   # SIGSTOP ourselves right before the write
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Mapping

__all__ = ["ACTIONS", "FaultPlan"]

ACTIONS = ("kill", "pause", "hang", "block")


class FaultPlan:
    """``{point: action}``; actions: ``kill`` (SIGKILL this process), ``pause`` (SIGSTOP this
    process: a test sends SIGCONT), ``hang`` (await forever: a stuck coroutine),
    ``block:SECONDS`` (block the event loop with a sync sleep). Each point fires once
    (the first attempt that reaches it) unless ``repeat`` is true. ``on_hit`` sees each hit
    first (e.g. to write it to a history file before the process stops)."""

    def __init__(
        self,
        points: Mapping[str, str],
        on_hit: Callable[[str, str], None] | None = None,
        *,
        repeat: bool = False,
    ) -> None:
        for point, action in points.items():
            if action.split(":", 1)[0] not in ACTIONS:
                raise ValueError(f"fault {point!r}: unknown action {action!r} (use {ACTIONS})")
        self.points, self.on_hit, self.repeat = dict(points), on_hit, repeat
        self.hits: list[str] = []

    @classmethod
    def parse(cls, spec: str, on_hit: Callable[[str, str], None] | None = None) -> FaultPlan:
        """From ``"before_commit=pause,after:load=block:3"``."""
        pairs = (item.split("=", 1) for item in spec.split(",") if item.strip())
        return cls({point.strip(): action.strip() for point, action in pairs}, on_hit)

    async def __call__(self, point: str) -> None:
        """The fault hook: act at ``point`` if the plan names it."""
        await self.hit(point)

    async def hit(self, point: str) -> None:
        action = self.points.get(point)
        if action is None or (point in self.hits and not self.repeat):
            return
        self.hits.append(point)
        if self.on_hit is not None:
            self.on_hit(point, action)
        kind, _, arg = action.partition(":")
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "pause":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == "hang":
            await asyncio.Event().wait()
        elif kind == "block":
            time.sleep(float(arg or "1"))  # noqa: ASYNC251 - blocking the loop is the fault
