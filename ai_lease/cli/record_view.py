"""How one job record is shown: the rows ``status`` prints, the row ``ls`` prints, and the
JSON object both print with ``--json``.

A record's stage and progress figures are what its owner published at its last heartbeat
(renewal), up to one renew interval ago: each view says so, beside the heartbeat's age, so
that a job streaming every 0.3 s does not read as idle for 4.5 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ai_lease.cli.output import ago, span
from ai_lease.observe.cpu_idle import cpu_idle_of, cpu_idle_text
from ai_lease.observe.phi import DEFAULT_THRESHOLD, is_suspect, phi_text
from ai_lease.redaction import redact

if TYPE_CHECKING:
    from ai_lease.job import JobState
    from ai_lease.observe.phi import OwnerPhi

__all__ = ["LS_HEADER", "describe", "duration", "job_json", "ls_row"]


_LS_ROW = "{:<32} {:<9} {:<10} {:<13} {:>8} {:>9} {:>8} {:>11}"
LS_HEADER = _LS_ROW.format("KEY", "STATUS", "HEALTH", "STAGE", "AGE", "DURATION", "IDLE", "BEAT")
"""``ls``'s header. STAGE and IDLE are as the owner reported them at its last heartbeat,
BEAT ago (a running job's record moves only at renewals)."""


def ls_row(job: JobState, grace: float) -> str:
    """One ``ls`` row: STAGE and IDLE as of the last heartbeat, and that heartbeat's age."""
    state = job.health(grace)
    running = job.status.value == "RUNNING"
    return _LS_ROW.format(
        job.key,
        job.status.value,
        state.value if state else "-",
        job.stage or "-",
        span(job.read_at - job.created_at) if job.created_at else "-",
        span(duration(job)),
        span(idle_at_heartbeat(job)),
        ago(job.since_heartbeat) if running else "-",
    )


def idle_at_heartbeat(job: JobState) -> float | None:
    """Seconds without progress as the owner reported at its last heartbeat (None: not
    running, or never reported): what the record knows, not how old the record is."""
    if job.status.value != "RUNNING" or job.heartbeat_at is None or job.last_progress_at is None:
        return None
    return max(0.0, job.heartbeat_at - job.last_progress_at)


def duration(job: JobState) -> float | None:
    """Seconds from the first acquisition to the end (or to now, while it runs)."""
    started = job.started_at
    if started is None:
        return None
    if not job.status.terminal:
        return job.read_at - started
    finished = getattr(job, "finished_at", None) or job.updated_at
    return max(0.0, finished - started)


def job_json(
    job: JobState,
    grace: float,
    phi: OwnerPhi | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    waiting: str | None = None,
) -> dict[str, Any]:
    """A record as one JSON object, the same for ``status --json``, ``status --watch --json``
    and ``ls --json``: its health, φ of its owner's renewals (``phi``: the value the text
    prints, null when unknown or not read, as by ``ls``; ``phi_text``: the text's row, null
    when not read), whether that makes it suspect, the CPU idle share of a stall snapshot, and its
    result decoded (a JSON result is JSON here, not a string holding JSON; one that is not
    JSON stays a string, flagged ``result_corrupt``); the stored spec likewise
    (``spec_corrupt``)."""
    out = job.to_dict()
    state = job.health(grace)
    out["health"] = state.value if state else None
    value = None if phi is None else phi.value
    out["phi"] = value
    out["phi_text"] = None if phi is None else phi_text(value, threshold)
    out["waiting"] = waiting  # "waiting for a slot of … (N ahead), since …"; null: not read
    out["suspect"] = is_suspect(value, state, threshold)
    out["cpu_idle_pct"] = cpu_idle_of(job.stall_snapshot)
    out["since_heartbeat"] = job.since_heartbeat  # the age of stage and progress figures
    out["idle_at_heartbeat"] = idle_at_heartbeat(job)
    if job.result is not None:
        try:
            out["result"] = job.output
        except orjson.JSONDecodeError:
            out["result_corrupt"] = True
    if isinstance(job.spec, str):  # the stored job spec is JSON: shown as an object too
        try:
            out["spec"] = orjson.loads(job.spec)
        except orjson.JSONDecodeError:
            out["spec_corrupt"] = True
    return out


def describe(
    job: JobState,
    grace: float,
    phi: OwnerPhi | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    *,
    waiting: str | None = None,
) -> list[tuple[str, str]]:
    """The rows ``status`` prints for ``job`` (with ``phi``: its owner's suspicion; with
    ``waiting``: what its owner waits for, a slot)."""
    health = job.health(grace)
    shown = health.value if health else "-"
    value = None if phi is None else phi.value
    rows = [
        ("status", job.status.value),
        ("health", shown + (", suspect" if is_suspect(value, health, threshold) else "")),
        ("owner", f"{job.owner_id or '-'} (token {job.token})"),
        ("stage", (job.stage or "-") + _as_of(job)),
        *([("waiting", redact(waiting))] if waiting else []),
        ("progress", _progress(job)),
        ("heartbeat", ago(job.since_heartbeat)),
        ("lease", f"{span(job.lease_remaining)} left" if job.lease_live else "lapsed or none"),
        (
            "attempts",
            f"{job.attempts} (takeovers {job.takeovers}, missed renewals {job.missed_renewals})",
        ),
        ("age", span(job.read_at - job.created_at) if job.created_at else "-"),
        ("duration", span(duration(job))),
    ]
    if phi is not None:
        rows.insert(2, ("suspicion", phi_text(value, threshold)))
    rows += _newer_rows(job)
    if job.finish_reason == "length":
        rows.append(("answer", "capped at max_tokens (finish_reason length)"))
    if job.failure_kind:
        rows.append(("failure", job.failure_kind))
    if job.last_error:
        rows.append(("last error", redact(job.last_error)))
    if job.stall_snapshot:
        idle = cpu_idle_of(job.stall_snapshot)
        if idle is not None:
            rows.append(("cpu idle", cpu_idle_text(idle)))
        rows.append(("stuck at", redact(job.stall_snapshot)))
    return rows


def _as_of(job: JobState) -> str:
    """For a running job's reported figures: when they were reported."""
    if job.status.value != "RUNNING" or job.since_heartbeat is None:
        return ""
    return f" (at the last heartbeat, {ago(job.since_heartbeat)})"


def _progress(job: JobState) -> str:
    """The progress row: its version, and how long the owner had gone without progress
    when it last reported (the record's own age is the heartbeat row's)."""
    idle = idle_at_heartbeat(job)
    if idle is None:
        return f"version {job.progress_version}, last {ago(job.since_progress)}"
    return f"version {job.progress_version}, idle {span(idle)}" + _as_of(job)


def _newer_rows(job: JobState) -> list[tuple[str, str]]:
    """Rows for the fields newer records carry (model, tokens, takeover cause), if any."""
    rows = []
    model = " / ".join(
        str(v) for v in (getattr(job, "provider", None), getattr(job, "model", None)) if v
    )
    if model:
        rows.append(("model", model))
    prompt, completion = (
        getattr(job, "prompt_tokens", None),
        getattr(job, "completion_tokens", None),
    )
    if prompt or completion:
        rows.append(("tokens", f"{prompt or 0} prompt, {completion or 0} completion"))
    cause = getattr(job, "takeover_cause", None)
    if cause:
        rows.append(("taken over", redact(str(cause))))
    return rows
