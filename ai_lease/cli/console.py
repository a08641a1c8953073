"""What ``ai-lease submit`` shows while a job runs: who owns it, the stage, the budget that
applies now and the time it has left, chunks and tokens, the time since the last progress,
the lease token, and the streamed text; at the end one summary line.

On a terminal it is a live panel (rich) redrawn on a timer, so "since progress" grows
during a stall; otherwise one plain line per event with the figures it carries, so logs and
pipes stay readable. Text arrives through :class:`TeeProvider`, a pass-through wrapper: the
runner's hot path is untouched (a chunk only updates counters; the timer draws).
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ai_lease.observe.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider
from ai_lease.timeouts import LeaseTimings, StreamTimeouts

if TYPE_CHECKING:
    from ai_lease.job import JobState

__all__ = ["JobView", "TeeProvider"]

Clock = Callable[[], float]

_QUIET_KINDS = {"renewed", "following"}
TAIL_CHARS = 600
"""How much of the streamed text the live view keeps and shows."""
REFRESH_PER_SECOND = 8.0
"""How often the live panel is redrawn, events or not."""
_STAGE_BUDGET = re.compile(r"max_no_progress (\S+?)s\b")
_ATTEMPT = re.compile(r"attempt (\d+)")


class TeeProvider:
    """Passes a provider's stream through, copying its text to ``view``."""

    def __init__(self, inner: Provider, view: JobView) -> None:
        self.inner, self.view = inner, view
        self.name = inner.name
        self.model = getattr(inner, "model", None)  # the record names the model that ran

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.view.stream_opened()
        try:
            async for delta in self.inner.stream(request):
                if delta.text:
                    self.view.on_text(delta.text)
                yield delta
        finally:
            self.view.stream_closed()

    async def complete(self, request: ChatRequest) -> Completion:
        completion = await self.inner.complete(request)
        self.view.on_text(completion.text)
        return completion

    async def aclose(self) -> None:
        await self.inner.aclose()


class JobView:
    """The state shown for one job, fed by runner events and streamed text.

    ``timings`` / ``stream`` are the budgets the run is under (the CLI passes the
    settings'); ``clock`` (monotonic seconds) and ``console`` are for tests.
    """

    def __init__(
        self,
        key: str,
        *,
        live: bool,
        out: TextIO | None = None,
        timings: LeaseTimings | None = None,
        stream: StreamTimeouts | None = None,
        clock: Clock = time.monotonic,
        console: Console | None = None,
        auto_refresh: bool = True,
    ) -> None:
        self.key, self.live, self.clock = key, live, clock
        self.out = out or sys.stderr
        self.timings, self.stream = timings or LeaseTimings(), stream or StreamTimeouts()
        self.role, self.owner, self.token, self.stage = "starting", "-", 0, "-"
        self.chunks, self.attempt, self.started = 0, 0, clock()
        self.last_progress = self.started
        self.stage_budget: float | None = None
        self.stream_started: float | None = None  # while a streamed call is open
        self.last_text_at: float | None = None  # the open stream's latest content
        self.model: dict[str, float | int | str] = {}  # the last model_call's figures
        self.summary: str | None = None
        # Only the tail is ever shown: keep that much, so a long answer costs O(chunk) per
        # chunk (a growing ``str +=`` re-copied the whole answer on every chunk). The lock:
        # the live panel is drawn from rich's refresh thread.
        self._tail: deque[str] = deque()
        self._tail_chars = 0
        self._lock = threading.Lock()
        self.lines: list[str] = []
        self._console, self._auto = console, auto_refresh
        self._live: Live | None = None

    # -- feeding -------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if event.kind in ("acquired", "takeover"):
            self.role = "owner"
            if found := _ATTEMPT.match(event.detail):
                self.attempt = int(found.group(1))
        elif event.kind == "following":
            self.role = "follower"
        elif event.kind == "model_call" and event.attrs:
            self.model = dict(event.attrs)
        changed_owner = bool(event.owner_id) and event.owner_id != self.owner
        if event.owner_id:
            self.owner, self.token = event.owner_id, event.token or 0
        if event.stage and event.stage != self.stage and event.kind in ("stage", "following"):
            self.stage, self.last_progress = event.stage, self.clock()
            self.stage_budget = self._stage_budget(event)
        if event.kind not in _QUIET_KINDS or changed_owner:
            self._log(event)
        self.refresh()

    def on_text(self, text: str) -> None:
        self.chunks += 1
        self._keep(text)
        self.last_progress = self.last_text_at = self.clock()

    def stream_opened(self) -> None:
        """A streamed call starts: the first-token budget applies until its first content."""
        self.reset_text()
        self.stream_started, self.last_text_at = self.clock(), None

    def stream_closed(self) -> None:
        self.stream_started = self.last_text_at = None

    @property
    def text(self) -> str:
        """The last :data:`TAIL_CHARS` characters of the streamed text (what is shown)."""
        with self._lock:
            return "".join(self._tail)[-TAIL_CHARS:]

    def reset_text(self) -> None:
        with self._lock:
            self._tail.clear()
            self._tail_chars = 0

    def _keep(self, text: str) -> None:
        text = text[-TAIL_CHARS:]
        with self._lock:
            self._tail.append(text)
            self._tail_chars += len(text)
            while self._tail_chars - len(self._tail[0]) >= TAIL_CHARS:
                self._tail_chars -= len(self._tail.popleft())

    def _stage_budget(self, event: Event) -> float:
        """The stage's no-progress budget: as the stage event says it (adaptive budgets
        included), else the timings'."""
        found = _STAGE_BUDGET.search(event.detail) if event.kind == "stage" else None
        if found:
            try:
                return float(found.group(1))
            except ValueError:
                pass
        return self.timings.budget(event.stage).max_no_progress

    def _log(self, event: Event) -> None:
        who = f"{event.owner_id} token {event.token}" if event.owner_id else ""
        stage = f" [{event.stage}]" if event.stage else ""
        said = " ".join(p for p in (event.detail, figures(event)) if p)
        # the panel shows owner and token above its event lines: they name neither
        self.lines.append(f"{event.kind:<13}{stage} {said}".rstrip())
        if not self.live:
            line = f"{event.kind:<13} {who}{stage} {said}".rstrip()
            print(f"ai-lease: {line}", file=self.out, flush=True)

    # -- what applies now ----------------------------------------------------------------------

    def budget_now(self) -> tuple[str, float, float] | None:
        """The budget that applies now: its name, its seconds, and the seconds it has left
        (negative: overrun). A streamed call's first-token budget until its first content,
        then its idle budget; otherwise the stage's no-progress budget."""
        now = self.clock()
        if self.stream_started is not None:
            if self.last_text_at is None:
                first = self.stream.first_token
                return "first_token", first, first - (now - self.stream_started)
            return "idle", self.stream.idle, self.stream.idle - (now - self.last_text_at)
        if self.stage_budget is None:
            return None
        budget = self.stage_budget
        return f"stage {self.stage}", budget, budget - (now - self.last_progress)

    def finish(self, record: JobState) -> None:
        """The job ended with ``record``: draw (or print) its summary line."""
        status = record.status.value
        self._end(status, getattr(record, "attempts", 0) or 0, record)

    def _end(self, label: str, attempts: int, record: JobState | None = None) -> None:
        parts = [f"{label} in {seconds(self.clock() - self.started)}"]
        chunks = self.model.get("chunks", self.chunks)
        if chunks:
            parts.append(f"{chunks} chunks")
        tokens = _tokens(self.model, record)
        if tokens:
            parts.append(tokens)
        token = self.token or (record.token if record is not None else 0)
        if token:
            parts.append(f"token {short_token(token)}")
        if attempts:
            parts.append(f"attempt {attempts}")
        if self.role == "follower":
            parts.append(f"followed {self.owner}")
        self.summary = " · ".join(parts)
        if not self.live:
            print(f"ai-lease: {self.summary}", file=self.out, flush=True)

    # -- drawing -------------------------------------------------------------------------------

    def __enter__(self) -> JobView:
        self.started = self.last_progress = self.clock()
        if self.live:
            console = self._console or Console(file=self.out)
            self._live = Live(
                console=console,
                get_renderable=self._render,
                refresh_per_second=REFRESH_PER_SECOND,
                auto_refresh=self._auto,
                transient=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.summary is None and exc is not None:
            self._end(_ended_by(exc), self.attempt)
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def refresh(self) -> None:
        """Redraw now (events do; the timer redraws anyway)."""
        if self._live is not None:
            self._live.refresh()

    def _render(self) -> Panel:
        facts = Table.grid(padding=(0, 2))
        idle = self.clock() - self.last_progress
        facts.add_row("role", self.role, "owner", self.owner)
        facts.add_row("stage", self.stage, "token", str(self.token))
        facts.add_row("chunks", str(self.chunks), "since progress", seconds(idle))
        facts.add_row("elapsed", seconds(self.clock() - self.started), "budget", self._budget())
        events = Text("\n".join(self.lines[-6:]), style="dim", no_wrap=True, overflow="ellipsis")
        if self.summary is not None:  # the answer itself is printed once, after the panel
            ok = self.summary.startswith("DONE")
            end = Text(self.summary, style="bold green" if ok else "bold red")
            return Panel(Group(facts, events, end), title=f"job {self.key}", expand=True)
        tail = Text(self.text or "…", style="bold")
        return Panel(Group(facts, events, tail), title=f"job {self.key}", expand=True)

    def _budget(self) -> str:
        now = self.budget_now()
        if now is None or self.summary is not None:
            return "-"
        name, budget, left = now
        if math.isinf(budget):
            return f"{name} (no limit)"
        state = f"{seconds(left)} left" if left >= 0 else f"over by {seconds(-left)}"
        return f"{name} {budget:g} s · {state}"


def seconds(value: float) -> str:
    """``1.4 s``: what the view shows of a span."""
    return f"{value:.1f} s"


def short_token(token: int) -> str:
    """A fencing token as the summary line shows it: its first digits (status has it all)."""
    text = str(token)
    return text if len(text) <= 6 else f"{text[:4]}…"


def figures(event: Event) -> str:
    """The figures an event carries, as the text after its detail ("" if none)."""
    value = event.value
    if event.kind == "model_call" and event.attrs:
        attrs = event.attrs
        parts = [f"{attrs.get('chunks', 0)} chunks", _tokens(attrs, None)]
        if attrs.get("finish_reason"):
            parts.append(f"finish {attrs['finish_reason']}")
        return "· " + " · ".join(p for p in parts if p)
    if value is None:
        return ""
    if event.kind in ("first_token", "stage_done", "committed"):
        return f"after {value:.3f} s" if event.kind == "first_token" else f"in {value:.3f} s"
    if event.kind == "stream_gap":
        return f"max gap {value:.3f} s"
    if event.kind == "stream_timeout":
        return f"budget {value:g} s"
    return f"({value:g})"


def _tokens(attrs: dict[str, Any] | Any, record: JobState | None) -> str:
    """``184/66 tokens`` (prompt/completion) from a model call's figures, else the record's."""
    prompt, completion = attrs.get("prompt_tokens"), attrs.get("completion_tokens")
    if not prompt and not completion and record is not None:
        prompt = getattr(record, "prompt_tokens", None)
        completion = getattr(record, "completion_tokens", None)
    if not prompt and not completion:
        return ""
    return f"{prompt or 0}/{completion or 0} tokens"


def _ended_by(exc: BaseException) -> str:
    """The summary's first word for a run that raised ``exc``."""
    from ai_lease.cli.exits import EXIT_TIMED_OUT, exit_code
    from ai_lease.errors import AiLeaseError, JobCancelled

    if isinstance(exc, KeyboardInterrupt):
        return "INTERRUPTED"
    if isinstance(exc, JobCancelled):
        return "CANCELLED"
    if isinstance(exc, AiLeaseError) and exit_code(exc) == EXIT_TIMED_OUT:
        return "TIMED OUT"
    return "FAILED"
