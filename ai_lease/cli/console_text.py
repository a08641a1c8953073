"""The words and figures of the live view (:mod:`~ai_lease.cli.console`): spans, tokens,
an event's figures, and the summary line's first word for a run that raised."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ai_lease.lease.events import Event

if TYPE_CHECKING:
    from ai_lease.job import JobState

__all__ = ["ended_by", "figures", "seconds", "short_token", "tokens_text"]


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
        parts = [f"{attrs.get('chunks', 0)} chunks", tokens_text(attrs, None)]
        if attrs.get("finish_reason"):
            parts.append(f"finish {attrs['finish_reason']}")
        return "· " + " · ".join(p for p in parts if p)
    if value is None:
        return ""
    if event.kind in ("first_token", "first_visible"):
        return f"after {value:.3f} s"
    if event.kind in ("stage_done", "committed"):
        return f"in {value:.3f} s"
    if event.kind == "stream_gap":
        return f"max gap {value:.3f} s"
    if event.kind == "stream_timeout":
        return f"budget {value:g} s"
    return f"({value:.0f})" if float(value).is_integer() else f"({value:.3f})"


def tokens_text(attrs: dict[str, Any] | Any, record: JobState | None) -> str:
    """``184/66 tokens`` (prompt/completion) from a model call's figures, else the record's."""
    prompt, completion = attrs.get("prompt_tokens"), attrs.get("completion_tokens")
    if not prompt and not completion and record is not None:
        prompt = getattr(record, "prompt_tokens", None)
        completion = getattr(record, "completion_tokens", None)
    if not prompt and not completion:
        return ""
    return f"{prompt or 0}/{completion or 0} tokens"


def ended_by(exc: BaseException, *, key: str, started: bool) -> tuple[str, str]:
    """The summary's first word for a run that raised ``exc``, and a note after it.
    ``started``: this run acquired or followed the job (else it stopped before: bad input
    stored nothing; a job found already ended gets the hint that runs it again)."""
    from ai_lease.cli.exits import EXIT_BAD_INPUT, EXIT_TIMED_OUT, exit_code
    from ai_lease.cli.interrupt import Interrupted
    from ai_lease.errors import AiLeaseError, JobCancelled, JobFailed

    if isinstance(exc, Interrupted):
        return "INTERRUPTED", _handed_over(exc.detail)
    if isinstance(exc, KeyboardInterrupt):
        return "INTERRUPTED", ""
    if isinstance(exc, JobCancelled):
        return "CANCELLED", "" if started else "it already was: `submit --force` runs it again"
    code = exit_code(exc) if isinstance(exc, AiLeaseError) else None
    if not started and code == EXIT_BAD_INPUT:
        return "NOT RUN", "bad input: nothing stored"
    label = "TIMED OUT" if code == EXIT_TIMED_OUT else "FAILED"
    if not started and isinstance(exc, JobFailed):
        again = f"`ai-lease retry {key}` or `submit --force` runs it again"
        return f"ALREADY {label}", f"stored before this run: {again}"
    return label, ""


def _handed_over(detail: str) -> str:
    """What an interrupted run did with its job, as the summary says it."""
    for said, note in (("left to workers", "left to workers"), ("cancelled", "job cancelled")):
        if said in detail:
            return note
    return "not handed over: its lease lapses on its own" if "not handed over" in detail else ""
