"""Turning recorded durations into budgets a person can read and adopt (``ai-lease tune``)."""

from __future__ import annotations

from collections.abc import Sequence

from ai_lease.observe.history import Suggestion
from ai_lease.settings import Settings

__all__ = ["render_table", "render_toml"]


def _s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _current(s: Suggestion, settings: Settings) -> float | None:
    if s.kind == "stage":
        stage = settings.stages.get(s.stage)
        return stage.max_no_progress if stage else None
    if s.kind == "first_token":
        return settings.stream.first_token
    if s.kind == "gap":
        return settings.stream.idle
    return None


def render_table(suggestions: Sequence[Suggestion], settings: Settings) -> str:
    """One row per (pipeline, kind, stage): samples, P50/P95/P99/P99.9, now, suggested."""
    if not suggestions:
        return "no recorded durations yet: run some jobs first"
    head = (
        f"{'pipeline':<10} {'kind':<12} {'stage':<13} {'samples':>7} {'p50':>8} {'p95':>8} "
        f"{'p99':>8} {'p99.9':>8} {'now':>8} {'suggest':>8}  note"
    )
    rows = [head]
    for s in suggestions:
        now = _current(s, settings)
        note = ""
        if s.kind == "first_visible":
            note = "first answer text, after any reasoning: no budget of its own"
        elif s.false_takeovers:
            note = f"{s.false_takeovers} false takeovers: budget too tight"
        elif s.suggested is None:
            note = "too few samples"
        elif now is not None and s.suggested > now:
            note = "over the current budget: raise it, or expect takeovers"
        rows.append(
            f"{s.pipeline:<10} {s.kind:<12} {s.stage:<13} {s.samples:>7} {_s(s.p50):>8} "
            f"{_s(s.p95):>8} {_s(s.p99):>8} {_s(s.p999):>8} {_s(now):>8} "
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
