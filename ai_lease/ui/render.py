"""The dashboard's HTML: Jinja2 templates with autoescape on, and what a job page shows.

Every value from the store reaches a template as plain text and is escaped there; the only
markup passed through is the timeline's SVG, which escapes its own values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import orjson
from markupsafe import Markup

from ai_lease.job import JobState
from ai_lease.lease.timeline import TimelineEntry, slot_waiting
from ai_lease.observe.cpu_idle import cpu_idle_of, cpu_idle_text
from ai_lease.observe.phi import DEFAULT_THRESHOLD, owner_phi
from ai_lease.redaction import redact
from ai_lease.ui.present import job_row
from ai_lease.ui.timeline_svg import render_timeline

__all__ = [
    "CONTAINER_METHODS",
    "MAX_SHOWN_CHARS",
    "FieldsOnly",
    "Templates",
    "job_context",
    "timeline_markup",
]

TEMPLATES = Path(__file__).resolve().parent / "templates"
MAX_SHOWN_CHARS = 200_000
"""A result or snapshot longer than this is cut on the page (the CLI shows it whole)."""


_CONTAINERS = (dict, list, tuple, set, frozenset, str, bytes)
CONTAINER_METHODS = frozenset(
    name for kind in _CONTAINERS for name in dir(kind) if not name.startswith("_")
)
"""Attribute names a dict, list or string answers with a method (``keys``, ``items``,
``count``, ``index``…): never a field name in a template's context."""


class FieldsOnly(jinja2.Environment):
    """An environment where ``x.name`` on a dict reads its item and on a list or string is
    an error: a container's method never stands in for a missing field (``w.keys`` of a
    dict is otherwise the bound method, and iterating it a 500)."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping):
            return obj[attribute] if attribute in obj else self.undefined(obj=obj, name=attribute)
        if isinstance(obj, _CONTAINERS) and attribute in CONTAINER_METHODS:
            return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


class Templates:
    """The package's templates, autoescaped, rendered to strings."""

    def __init__(self) -> None:
        self.env = FieldsOnly(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=False,
        )

    def render(self, name: str, **context: Any) -> str:
        """Template ``name`` rendered with ``context``."""
        return self.env.get_template(name).render(**context)


def timeline_markup(
    entries: Sequence[TimelineEntry], job: JobState, dropped: int, ttl: float | None = None
) -> Markup:
    """The job's timeline as inline SVG (:func:`~ai_lease.ui.timeline_svg.render_timeline`,
    which escapes every value it draws); ``ttl``: the configured lease length, to mark where
    a lapsed lease expired on a finished job's timeline too."""
    return render_timeline(entries, job, dropped=dropped, ttl=ttl)


def _when(at: float | None) -> str | None:
    if not at:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


_RECORD = (
    *("status", "owner_id", "token", "stage", "progress_version", "attempts", "takeovers"),
    *("takeover_cause", "missed_renewals", "stall_policy", "max_no_progress", "renew_interval"),
    *("last_error", "last_error_attempt", "last_error_owner", "finish_reason", "provider"),
    *("model", "prompt_tokens", "completion_tokens", "reasoning_tokens", "first_token_s"),
    *("first_visible_s", "stage_durations", "failure_kind"),
)
_TIMES = ("created_at", "started_at", "heartbeat_at", "last_progress_at", "lease_expires_at")
_TIMES_END = ("finished_at", "updated_at")


def record_items(job: JobState) -> list[tuple[str, str]]:
    """The record as (field, text) pairs for the ``<dl>``; empty fields left out, times in
    UTC, every text redacted of registered secrets."""
    items: list[tuple[str, str]] = []
    for name in (*_RECORD[:1], *_RECORD[1:], *_TIMES, *_TIMES_END):
        value = getattr(job, name)
        if name in _TIMES or name in _TIMES_END:
            value = _when(value)
        elif name == "status":
            value = job.status.value
        if value is None or value == "":
            continue
        items.append((name, redact(str(value))))
    if job.status.value == "RUNNING":
        items.append(("lease_remaining", f"{job.lease_remaining:.1f} s"))
    return items


def _shown(text: str | None) -> str:
    if text is None:
        return ""
    return _cut(redact(text))


def _result_text(job: JobState) -> str:
    """The committed result exactly as stored — a text job's text, a JSON job's JSON — never
    redacted (a model's answer is not a diagnostic) nor reformatted; HTML-escaped by the
    template, cut only past :data:`MAX_SHOWN_CHARS` (and said so)."""
    if job.result is None:
        return "(no result yet)" if not job.status.terminal else "(no result)"
    try:
        value = orjson.loads(job.result)
    except orjson.JSONDecodeError:
        value = None
    return _cut(value if isinstance(value, str) else job.result)


def _cut(text: str) -> str:
    if len(text) > MAX_SHOWN_CHARS:
        return text[:MAX_SHOWN_CHARS] + f"\n… ({len(text) - MAX_SHOWN_CHARS} more characters)"
    return text


def job_context(
    job: JobState,
    entries: Sequence[TimelineEntry],
    dropped: int,
    phi_threshold: float = DEFAULT_THRESHOLD,
    lease_ttl: float | None = None,
) -> dict[str, Any]:
    """What ``_job_live.html`` shows for ``job`` and its timeline (with the φ suspicion of
    a RUNNING job's owner, from the renewals in ``entries``; ``lease_ttl``, the configured
    lease length, marks a lapsed lease's expiry)."""
    phi = owner_phi(entries, job, phi_threshold)
    idle = cpu_idle_of(job.stall_snapshot)
    waiting = slot_waiting(entries, job)
    return {
        "waiting": None if waiting is None else redact(waiting.detail),
        "phi": None if phi is None else phi.text,
        "cpu_idle": None if idle is None else cpu_idle_text(idle),
        "job": job,
        "row": job_row(job),
        "record": record_items(job),
        "timeline": timeline_markup(entries, job, dropped, lease_ttl),
        "snapshot": _shown(job.stall_snapshot),
        "result": _result_text(job),
    }
