"""Where stuck work is stuck: a bounded text snapshot of a task's await chain or a thread's
stack, stored in the job record when the job stalls (the second seed's post-mortem state).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import types
from typing import Any

from ai_lease.redaction import redact

__all__ = ["snapshot"]

MAX_FRAMES = 40
MAX_CHARS = 8_000


def _frame_of(obj: Any) -> types.FrameType | None:
    for name in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(obj, name, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None


def _awaited(obj: Any) -> Any:
    for name in ("cr_await", "gi_yieldfrom", "ag_await"):
        inner = getattr(obj, name, None)
        if inner is not None:
            return inner
    # ``async for`` awaits an ``async_generator_asend`` wrapper, which does not expose its
    # generator; the garbage collector knows it. (Diagnostics only: runs once per stall.)
    for ref in gc.get_referents(obj):
        if isinstance(ref, types.AsyncGeneratorType | types.CoroutineType):
            return ref
    return None


def _await_chain(coro: Any) -> list[types.FrameType]:
    """The frames of a suspended coroutine and everything it awaits, outermost first."""
    frames: list[types.FrameType] = []
    for _ in range(MAX_FRAMES * 25):  # keep the innermost frames: that is where it is stuck
        if coro is None:
            break
        frame = _frame_of(coro)
        if frame is not None:
            frames.append(frame)
        coro = _awaited(coro)
    return frames[-MAX_FRAMES:]


def _thread_frames(ident: int) -> list[types.FrameType]:
    frame = sys._current_frames().get(ident)
    frames: list[types.FrameType] = []
    while frame is not None and len(frames) < MAX_FRAMES:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _format(frames: list[types.FrameType]) -> list[str]:
    return [
        f'  File "{f.f_code.co_filename}", line {f.f_lineno}, in {f.f_code.co_name}' for f in frames
    ]


def snapshot(task: asyncio.Task[Any] | None, thread_ident: int | None, header: str) -> str:
    """``header``, then the stuck task's await chain and, if a sync stage is running in a
    worker thread, that thread's stack; innermost call last, at most ``MAX_CHARS``."""
    lines = [redact(header)]
    if task is not None and not task.done():
        lines += ["coroutine (innermost last):", *_format(_await_chain(task.get_coro()))]
    if thread_ident is not None:
        lines += [
            f"thread {thread_ident} (innermost last):",
            *_format(_thread_frames(thread_ident)),
        ]
    text = "\n".join(lines)
    if len(text) <= MAX_CHARS:
        return text
    # Keep the start of the header and the innermost frames: the end is where it is stuck.
    head = lines[0][: MAX_CHARS // 4] + "\n  … (cut)\n"
    return head + text[-(MAX_CHARS - len(head)) :]
