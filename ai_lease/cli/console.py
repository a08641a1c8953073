"""What ``ai-lease submit`` shows while a job runs: who owns it, the stage, tokens streamed,
time since the last progress, the lease token, and the streamed text.

On a terminal it is a live panel (rich); otherwise one plain line per event, so logs and
pipes stay readable. Text arrives through :class:`TeeProvider`, a pass-through wrapper: the
runner's hot path is untouched.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ai_lease.observe.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider

__all__ = ["JobView", "TeeProvider"]

_QUIET_KINDS = {"renewed", "following"}
TAIL_CHARS = 600
"""How much of the streamed text the live view keeps and shows."""


class TeeProvider:
    """Passes a provider's stream through, copying its text to ``view``."""

    def __init__(self, inner: Provider, view: JobView) -> None:
        self.inner, self.view = inner, view
        self.name = inner.name

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.view.reset_text()
        async for delta in self.inner.stream(request):
            if delta.text:
                self.view.on_text(delta.text)
            yield delta

    async def complete(self, request: ChatRequest) -> Completion:
        completion = await self.inner.complete(request)
        self.view.on_text(completion.text)
        return completion

    async def aclose(self) -> None:
        await self.inner.aclose()


class JobView:
    """The state shown for one job, fed by runner events and streamed text."""

    def __init__(self, key: str, *, live: bool, out: TextIO | None = None) -> None:
        self.key, self.live = key, live
        self.out = out or sys.stderr
        self.role, self.owner, self.token, self.stage = "starting", "-", 0, "-"
        self.chunks, self.last_progress = 0, time.monotonic()
        # Only the tail is ever shown: keep that much, so a long answer costs O(chunk) per
        # chunk (a growing ``str +=`` re-copied the whole answer on every chunk).
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self.lines: list[str] = []
        self._live: Live | None = None

    # -- feeding -------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if event.kind == "acquired":
            self.role = "owner"
        elif event.kind == "following":
            self.role = "follower"
        changed_owner = bool(event.owner_id) and event.owner_id != self.owner
        if event.owner_id:
            self.owner, self.token = event.owner_id, event.token or 0
        if event.stage and event.stage != self.stage and event.kind in ("stage", "following"):
            self.stage, self.last_progress = event.stage, time.monotonic()
        if event.kind not in _QUIET_KINDS or changed_owner:
            self._log(event)
        self.refresh()

    def on_text(self, text: str) -> None:
        self.chunks += 1
        self._keep(text)
        self.last_progress = time.monotonic()
        self.refresh()

    @property
    def text(self) -> str:
        """The last :data:`TAIL_CHARS` characters of the streamed text (what is shown)."""
        return "".join(self._tail)[-TAIL_CHARS:]

    def reset_text(self) -> None:
        self._tail.clear()
        self._tail_chars = 0

    def _keep(self, text: str) -> None:
        text = text[-TAIL_CHARS:]
        self._tail.append(text)
        self._tail_chars += len(text)
        while self._tail_chars - len(self._tail[0]) >= TAIL_CHARS:
            self._tail_chars -= len(self._tail.popleft())

    def _log(self, event: Event) -> None:
        who = f"{event.owner_id} token {event.token}" if event.owner_id else ""
        stage = f" [{event.stage}]" if event.stage else ""
        line = f"{event.kind:<13} {who}{stage} {event.detail}".rstrip()
        self.lines.append(line)
        if not self.live:
            print(f"ai-lease: {line}", file=self.out, flush=True)

    # -- drawing -------------------------------------------------------------------------------

    def __enter__(self) -> JobView:
        if self.live:
            console = Console(file=self.out)
            self._live = Live(
                self._render(), console=console, refresh_per_second=8, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Panel:
        facts = Table.grid(padding=(0, 2))
        idle = time.monotonic() - self.last_progress
        facts.add_row("role", self.role, "owner", self.owner)
        facts.add_row("stage", self.stage, "token", str(self.token))
        facts.add_row("chunks", str(self.chunks), "since progress", f"{idle:.1f}s")
        events = Text("\n".join(self.lines[-6:]), style="dim")
        tail = Text(self.text or "…", style="bold")
        return Panel(Group(facts, events, tail), title=f"job {self.key}", expand=True)
