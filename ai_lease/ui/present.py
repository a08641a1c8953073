"""How the dashboard shows values: relative times, durations, a job as a table row.

Pure functions of a record (no store, no web framework): the templates only place them.
Every string here is plain text; Jinja2's autoescape escapes it when it is rendered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ai_lease.errors import CorruptRecord
from ai_lease.job import JobState
from ai_lease.lease.queue import WorkerInfo
from ai_lease.lease.rules import node_of
from ai_lease.redaction import redact

__all__ = [
    "THROUGHPUT_S",
    "AttentionRow",
    "CorruptRow",
    "JobLink",
    "JobRow",
    "WorkerRow",
    "ago",
    "attention_row",
    "corrupt_row",
    "job_row",
    "job_url",
    "live_url",
    "span",
    "worker_row",
]


def span(seconds: float | None) -> str:
    """A duration for people: ``850 ms``, ``4.2 s``, ``3 min``, ``2 h``, ``5 d`` (``-``: none)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"  # pragma: no cover - the loop always returns


def ago(seconds: float | None) -> str:
    """``3 s ago`` (``-`` when unknown)."""
    return "-" if seconds is None else f"{span(seconds)} ago"


def job_url(key: str) -> str:
    """The job page's path, the key quoted (a key may hold ``/``, ``?`` or ``<``)."""
    return "/jobs/" + quote(key, safe="")


def live_url(key: str) -> str:
    """The job page's live stream (apart from ``/jobs/``: a key may be ``stream``)."""
    return "/live/jobs/" + quote(key, safe="")


@dataclass(frozen=True, slots=True)
class JobRow:
    """One row of the jobs table, as text."""

    key: str
    url: str
    status: str
    health: str  # "" when the job is not running
    health_class: str
    stage: str
    since_heartbeat: str
    since_progress: str
    owner: str
    token: str
    attempts: int
    takeovers: int
    age: str
    duration: str
    # Seconds behind each growing time, for the page to tick on (None: it does not grow).
    heartbeat_s: float | None = None
    progress_s: float | None = None
    age_s: float | None = None
    duration_s: float | None = None


def job_row(job: JobState) -> JobRow:
    """The jobs table's row for ``job``; times relative to when the store read it."""
    health = job.health()
    ended = job.finished_at if job.status.terminal and job.finished_at else job.read_at
    return JobRow(
        key=job.key,
        url=job_url(job.key),
        status=job.status.value,
        health="" if health is None else health.value,
        health_class="" if health is None else "health-" + health.value.replace(" ", "-"),
        stage=job.stage or "-",
        since_heartbeat=ago(job.since_heartbeat),
        since_progress=ago(job.since_progress),
        owner=job.owner_id or "-",
        token=str(job.token) if job.token else "-",
        attempts=job.attempts,
        takeovers=job.takeovers,
        age=span(job.read_at - job.created_at) if job.created_at else "-",
        duration=span(ended - job.started_at) if job.started_at else "-",
        **_growing(job),
    )


def _growing(job: JobState) -> dict[str, float | None]:
    """The times that grow while nothing is written: all of a running job's, a pending
    job's age; none of a finished job's but its age."""
    running = job.status.value == "RUNNING"
    return {
        "heartbeat_s": job.since_heartbeat if running else None,
        "progress_s": job.since_progress if running else None,
        "age_s": job.read_at - job.created_at if job.created_at else None,
        "duration_s": job.read_at - job.started_at if running and job.started_at else None,
    }


@dataclass(frozen=True, slots=True)
class AttentionRow:
    """A job that needs an operator's eye: its row, and why (its health, or its error)."""

    row: JobRow
    why: str


def attention_row(job: JobState) -> AttentionRow:
    """``job``'s row under "needs attention", saying why it is there."""
    health = job.health()
    if health is not None:
        why = f"{health.value}: " + _HEALTH_WHY.get(health.value, "")
    elif job.status.value == "FAILED":
        kind = f" ({job.failure_kind})" if job.failure_kind else ""  # the code, then the words
        why = f"failed{kind}: " + (job.last_error or "no error recorded")
    else:
        why = f"retrying (attempt {job.attempts} failed): {job.last_error or ''}"
    return AttentionRow(job_row(job), redact(why[:300]))


_HEALTH_WHY = {
    "zombie": "renewing, but no progress for too long",
    "node lost": "no heartbeat lately (progress was fresh)",
    "dead": "no heartbeat and no progress: due for takeover",
}


@dataclass(frozen=True, slots=True)
class JobLink:
    """A job's key and the path of its page."""

    key: str
    url: str
    health: str = ""  # a running job's, as its record says now
    health_class: str = ""
    stage: str = "-"


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One row of the workers table, as text (a dataclass, not a dict: in a template
    ``w.keys`` of a dict is the dict's method, not a field)."""

    worker_id: str
    host: str
    pid: int
    running: int
    concurrency: int
    last_seen: str
    job_links: tuple[JobLink, ...]
    last_seen_s: float = 0.0  # for the page to tick on
    beat_at: float = 0.0  # its last beat, by the store's clock (what changes, not the age)
    done: int = 0  # jobs it finished DONE in the last THROUGHPUT_S (of the newest read)
    failed: int = 0


def _link(key: str, job: JobState | None) -> JobLink:
    if job is None:
        return JobLink(key, job_url(key))
    row = job_row(job)
    return JobLink(key, row.url, row.health, row.health_class, row.stage)


def worker_row(
    worker: WorkerInfo,
    now: float,
    records: Mapping[str, JobState] | None = None,
    finished: Sequence[JobState] = (),
) -> WorkerRow:
    """The workers table's row for ``worker``; ``now`` on the store's clock. ``records``:
    its running jobs' records (their health); ``finished``: recently finished jobs, of which
    the ones its attempts ended in the last :data:`THROUGHPUT_S` are counted."""
    records = records or {}
    mine = [job for job in finished if _ended_by(job, worker.worker_id, now)]
    return WorkerRow(
        worker_id=worker.worker_id,
        host=worker.host,
        pid=worker.pid,
        running=worker.running,
        concurrency=worker.concurrency,
        last_seen=ago(now - worker.last_seen),
        last_seen_s=max(0.0, now - worker.last_seen),
        beat_at=worker.last_seen,
        job_links=tuple(_link(key, records.get(key)) for key in worker.jobs),
        done=sum(1 for job in mine if job.status.value == "DONE"),
        failed=sum(1 for job in mine if job.status.value == "FAILED"),
    )


THROUGHPUT_S = 600.0
"""The workers page counts each worker's jobs finished in this many seconds."""


def _ended_by(job: JobState, worker_id: str, now: float) -> bool:
    """Whether ``job`` ended in the last THROUGHPUT_S under an owner of ``worker_id`` (an
    owner id is ``<node id>#<n>.<random>``; a worker's node id is its worker id)."""
    owner = node_of(job.owner_id or job.last_error_owner or "")
    return (
        owner == worker_id and job.finished_at is not None and now - job.finished_at < THROUGHPUT_S
    )


@dataclass(frozen=True, slots=True)
class CorruptRow:
    """A stored entry that is no ai_lease record: its key, what is wrong, where to look."""

    key: str
    url: str
    detail: str


def corrupt_row(bad: CorruptRecord) -> CorruptRow:
    """The row that marks ``bad`` in a table (a job's links to its page; a worker's none)."""
    return CorruptRow(bad.key, job_url(bad.key) if bad.kind == "job" else "", bad.detail)
