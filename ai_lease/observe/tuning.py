"""Turning recorded durations into budgets a person can read and adopt (``ai-lease tune``).

The table shows each suggestion beside the budget in force now, read from what the caller
passes: anything with the :class:`CurrentBudgets` shape (the CLI passes its settings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ai_lease.observe.history import Suggestion

__all__ = ["CurrentBudgets", "StageBudgetNow", "StreamBudgetsNow", "render_table", "render_toml"]


class StageBudgetNow(Protocol):
    """One stage's budget in force now."""

    @property
    def max_no_progress(self) -> float: ...


class StreamBudgetsNow(Protocol):
    """A streamed call's budgets in force now."""

    @property
    def first_token(self) -> float: ...

    @property
    def idle(self) -> float: ...


class CurrentBudgets(Protocol):
    """The budgets in force now: per stage name (a stage not named has none of its own), and
    a stream's."""

    @property
    def stages(self) -> Mapping[str, StageBudgetNow]: ...

    @property
    def stream(self) -> StreamBudgetsNow: ...


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _current(s: Suggestion, now: CurrentBudgets) -> float | None:
    if s.kind == "stage":
        stage = now.stages.get(s.stage)
        return stage.max_no_progress if stage else None
    if s.kind == "first_token":
        return now.stream.first_token
    if s.kind == "gap":
        return now.stream.idle
    return None


def render_table(suggestions: Sequence[Suggestion], now: CurrentBudgets) -> str:
    """One row per (pipeline, kind, stage): samples, P50/P95/P99/P99.9, the budget in force
    now (from ``now``), suggested."""
    if not suggestions:
        return "no recorded durations yet: run some jobs first"
    head = (
        f"{'pipeline':<10} {'kind':<12} {'stage':<13} {'samples':>7} {'p50':>8} {'p95':>8} "
        f"{'p99':>8} {'p99.9':>8} {'now':>8} {'suggest':>8}  note"
    )
    rows = [head]
    for s in suggestions:
        current = _current(s, now)
        note = ""
        if s.kind == "first_visible":
            note = "first answer text, after any reasoning: no budget of its own"
        elif s.false_takeovers:
            note = f"{s.false_takeovers} false takeovers: budget too tight"
        elif s.suggested is None:
            note = "too few samples"
        elif current is not None and s.suggested > current:
            note = "over the current budget: raise it, or expect takeovers"
        rows.append(
            f"{s.pipeline:<10} {s.kind:<12} {s.stage:<13} {s.samples:>7} {_s(s.p50):>8} "
            f"{_s(s.p95):>8} {_s(s.p99):>8} {_s(s.p999):>8} {_s(current):>8} "
            f"{_s(s.suggested):>8}  {note}".rstrip()
        )
    return "\n".join(rows)


def render_toml(suggestions: Sequence[Suggestion]) -> str:
    """The suggestions as a settings file (stages and stream tables only)."""
    lines = ["# Budgets suggested by `ai-lease tune` from recorded durations.", ""]
    stream = {}
    for s in suggestions:
        if s.suggested is None:
            continue
        if s.kind == "stage":
            lines += [f"[stages.{s.stage}]", f"max_no_progress = {s.suggested:.3f}", ""]
        elif s.kind == "first_token":
            stream["first_token"] = s.suggested
        elif s.kind == "gap":
            stream["idle"] = s.suggested
    if stream:
        lines.append("[stream]")
        lines += [f"{name} = {value:.3f}" for name, value in stream.items()]
    return "\n".join(lines).rstrip() + "\n"
