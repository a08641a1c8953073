"""A scripted provider for tests and demos: a list of chunks, pauses, stalls and errors.

>>> provider = ScriptedProvider(["Hello", Pause(0.1), " world", Stall()])  # hangs after " world"

Every call replays the script from the start; ``calls`` counts them (a follower that returns
a committed result must not have called the provider again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ai_lease.providers.base import ChatRequest, Completion, Delta, Usage

__all__ = ["Pause", "Raise", "ScriptedProvider", "Stall"]


@dataclass(frozen=True)
class Pause:
    """Wait this long before the next step (a slow but live model)."""

    seconds: float


@dataclass(frozen=True)
class Stall:
    """Hang forever (until cancelled): the zombie's stuck call."""


@dataclass(frozen=True)
class Raise:
    """Raise this exception at this point of the stream."""

    error: BaseException


Step = str | Delta | Pause | Stall | Raise
"""A text is sent as one text delta; a :class:`Delta` as it is (reasoning, tool calls)."""


class ScriptedProvider:
    """Plays ``script`` as a stream; ``complete()`` plays it whole and joins the text."""

    name = "scripted"

    def __init__(self, script: Sequence[Step], *, finish_reason: str = "stop") -> None:
        self.script, self.finish_reason = list(script), finish_reason
        self.calls = 0
        self.closed = False

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.calls += 1
        chunks = 0
        for step in self.script:
            if isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
            elif isinstance(step, Stall):
                await asyncio.Event().wait()
            elif isinstance(step, Raise):
                raise step.error
            elif isinstance(step, Delta):
                chunks += bool(step.text)
                yield step
            else:
                chunks += 1
                yield Delta(text=step)
        yield Delta(finish_reason=self.finish_reason)
        yield Delta(usage=Usage(prompt_tokens=1, completion_tokens=chunks))

    async def complete(self, request: ChatRequest) -> Completion:
        parts, usage = [], None
        async for delta in self.stream(request):
            parts.append(delta.text)
            usage = delta.usage or usage
        return Completion("".join(parts), self.finish_reason, usage, chunks=len(parts))

    async def aclose(self) -> None:
        self.closed = True
