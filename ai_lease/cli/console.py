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

from ai_lease.cli.console_text import ended_by, figures, seconds, short_token, tokens_text
from ai_lease.cli.terminal import raw
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider
from ai_lease.text_safety import inert
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
_BACKOFF = re.compile(r"retrying in ([0-9]+(?:\.[0-9]+)?)s\b")
_HANDED_BACK = {"released", "retry"}


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

    ``timings`` / ``stream`` are the budgets the run is under and ``attempts`` the job's
    most attempts (the CLI passes the settings'); ``clock`` (monotonic seconds) and
    ``console`` are for tests.
    """

    def __init__(
        self,
        key: str,
        *,
        live: bool,
        out: TextIO | None = None,
        timings: LeaseTimings | None = None,
        stream: StreamTimeouts | None = None,
        attempts: int | None = None,
        clock: Clock = time.monotonic,
        console: Console | None = None,
        auto_refresh: bool = True,
    ) -> None:
        self.key, self.live, self.clock = key, live, clock
        self.out = raw(out or sys.stderr)  # rich draws with its own escapes: texts made inert
        self.timings, self.stream = timings or LeaseTimings(), stream or StreamTimeouts()
        self.role, self.owner, self.token, self.stage = "starting", "-", 0, "-"
        self.chunks, self.attempt, self.started = 0, 0, clock()  # chunks: this attempt's
        self.attempts = attempts
        self.last_progress = self.stage_started = self.started
        self.stage_budget: float | None = None
        self.retry_at: float | None = None  # when the backoff between attempts ends
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
        kind = event.kind
        if kind == "acquired":
            self._new_attempt(event)
        elif kind == "takeover":
            self.role = "owner"
        elif kind == "following":
            self.role, self.retry_at = "follower", None
        elif kind == "model_call" and event.attrs:
            self.model = dict(event.attrs)
        changed_owner = bool(event.owner_id) and event.owner_id != self.owner
        if event.owner_id and kind not in _HANDED_BACK:
            self.owner, self.token = event.owner_id, event.token or 0
        if event.stage and event.stage != self.stage and kind in ("stage", "following"):
            self.stage, self.last_progress = event.stage, self.clock()
            self.stage_started = self.last_progress
            self.stage_budget = self._stage_budget(event)
        if kind in _HANDED_BACK and self.role in ("owner", "between attempts"):
            self._handed_back(event)
        if kind not in _QUIET_KINDS or changed_owner:
            self._log(event)
        self.refresh()

    def _new_attempt(self, event: Event) -> None:
        """An acquisition: a new attempt, whose chunks and model figures start at zero."""
        self.role, self.retry_at, self.chunks, self.model = "owner", None, 0, {}
        if found := _ATTEMPT.match(event.detail):
            self.attempt = int(found.group(1))

    def _handed_back(self, event: Event) -> None:
        """The lease was released (or let go) after a failed attempt: no owner, no stage, no
        stage budget until the next acquisition; a ``retry`` says how long the backoff is."""
        self.role, self.owner, self.stage, self.stage_budget = "between attempts", "-", "-", None
        self.token = 0  # no lease held: the next acquisition brings a new token
        self.stream_closed()
        self.reset_text()
        found = _BACKOFF.search(event.detail) if event.kind == "retry" else None
        if found:
            self.role = "retrying"
            self.retry_at = self.clock() + float(found.group(1))

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
            print(f"ai-lease: {inert(line)}", file=self.out, flush=True)

    # -- what applies now ----------------------------------------------------------------------

    def budget_now(self) -> tuple[str, float, float] | None:
        """The tightest budget that applies now: its name, its seconds, and the seconds it
        has left (negative: overrun). Of the stage's no-progress budget and hard deadline
        and, while a streamed call is open, its first-token budget (until its first content)
        or idle budget (from the last), and its total budget: the one with least left."""
        now = self.clock()

        def left(name: str, budget: float, since: float) -> tuple[str, float, float]:
            return name, budget, budget - (now - since)

        found = []
        if self.stage_budget is not None:
            deadline = self.timings.budget(self.stage).deadline
            found.append(left(f"stage {self.stage}", self.stage_budget, self.last_progress))
            found.append(left(f"deadline {self.stage}", deadline, self.stage_started))
        opened, stream = self.stream_started, self.stream
        if opened is not None:
            if self.last_text_at is None:
                found.append(left("first_token", stream.first_token, opened))
            else:
                found.append(left("idle", stream.idle, self.last_text_at))
            found.append(left("total", stream.total, opened))
        return min(found, key=lambda named: named[2], default=None)

    def finish(self, record: JobState) -> None:
        """The job ended with ``record``: draw (or print) its summary line."""
        status = record.status.value
        self._end(status, getattr(record, "attempts", 0) or 0, record)

    def _end(
        self, label: str, attempts: int, record: JobState | None = None, note: str = ""
    ) -> None:
        parts = [f"{label} in {seconds(self.clock() - self.started)}"]
        chunks = self.model.get("chunks", self.chunks)
        if chunks:
            parts.append(f"{chunks} chunks")
        tokens = tokens_text(self.model, record)
        if tokens:
            parts.append(tokens)
        token = self.token or (record.token if record is not None else 0)
        if token:
            parts.append(f"token {short_token(token)}")
        if attempts:
            parts.append(f"attempt {attempts}")
        if self.role == "follower":
            parts.append(f"followed {self.owner}")
        if note:
            parts.append(note)
        self.summary = " · ".join(parts)
        if not self.live:
            print(f"ai-lease: {inert(self.summary)}", file=self.out, flush=True)

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
            started = self.attempt > 0 or self.role == "follower"
            label, note = ended_by(exc, key=self.key, started=started)
            self._end(label, self.attempt, note=note)
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
        facts.add_row("role", self.role, "owner", Text(inert(self.owner)))  # never markup
        facts.add_row("stage", self.stage, "token", str(self.token or "-"))
        facts.add_row("chunks", str(self.chunks), "since progress", seconds(idle))
        facts.add_row("elapsed", seconds(self.clock() - self.started), "budget", self._budget())
        said = inert("\n".join(self.lines[-6:]))
        events = Text(said, style="dim", no_wrap=True, overflow="ellipsis")
        title = Text(f"job {inert(self.key)}")
        if self.summary is not None:  # the answer itself is printed once, after the panel
            style = {"DONE": "bold green", "INTERRUPTED": "bold yellow"}
            end = Text(inert(self.summary), style=style.get(self.summary.split()[0], "bold red"))
            return Panel(Group(facts, events, end), title=title, expand=True)
        tail = Text(inert(self.text or "…"), style="bold")
        return Panel(Group(facts, events, tail), title=title, expand=True)

    def _budget(self) -> str:
        if self.summary is not None:
            return "-"
        if self.role in ("retrying", "between attempts"):
            return self._between()
        now = self.budget_now()
        if now is None:
            return "-"
        name, budget, left = now
        if math.isinf(budget):
            return f"{name} (no limit)"
        state = f"{seconds(left)} left" if left >= 0 else f"over by {seconds(-left)}"
        return f"{name} {budget:g} s · {state}"

    def _between(self) -> str:
        """Between attempts: when the next one starts, and which of how many it is."""
        upcoming = f"attempt {self.attempt + 1}" + (f"/{self.attempts}" if self.attempts else "")
        if self.retry_at is None:
            return f"waiting to compete again ({upcoming})"
        return f"retrying in {seconds(max(0.0, self.retry_at - self.clock()))} ({upcoming})"
