"""A job's timeline: what happened to it, written by the store's operations themselves
(:class:`JobTimeline`), and the notes a worker adds from outside them (:class:`JobNotes`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ai_lease.failure import timeline_detail
from ai_lease.lease.storable import diagnostic

if TYPE_CHECKING:
    from ai_lease.job import JobState

__all__ = [
    "NOTE_KINDS",
    "NOTE_LIMIT",
    "TIMELINE_CAP",
    "TIMELINE_KINDS",
    "JobNotes",
    "JobTimeline",
    "TimelineEntry",
    "check_note",
    "slot_waiting",
]


TIMELINE_CAP = 200
"""Entries a job's timeline keeps: the oldest go first, and are counted as dropped."""

NOTE_KINDS = ("terminated", "reaped", "model_call", "slot_wait")
"""What :meth:`JobNotes.note` may append: the termination ladder's steps (a signal sent to
an owner's child process, the child collected), written by the worker that sent them; and
each model call's ids (``model_call``: its ``X-Request-Id`` and client id), by its owner;
a model call that has to wait for a provider slot (``slot_wait``: which limit, how many
ahead), by its owner, once per wait."""

NOTE_LIMIT = 2000
"""Characters of a note's ``detail`` kept (the rest is clipped)."""

TIMELINE_KINDS = (
    *("acquired", "renewed", "renew_refused", "stalled", "released", "taken_over"),
    *("fenced_write_rejected", "committed", "failed", "cancelled"),
    *NOTE_KINDS,
)
"""What an entry can say; each is written inside the operation that caused it (the
:data:`NOTE_KINDS` by :meth:`JobNotes.note`, for what happened outside the store)."""


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One thing that happened to a job, in the store's order (``seq`` from 1) and by its
    clock (``at``): who (``owner_id``, ``token``) at which ``stage``; ``detail`` says more
    (a renewal's progress, a refusal's code, a takeover's cause)."""

    seq: int
    at: float
    kind: str
    owner_id: str
    token: int
    stage: str
    detail: str

    def __post_init__(self) -> None:
        # A store writes some details as codes (a job given up on); readers see the words.
        object.__setattr__(self, "detail", timeline_detail(self.kind, self.detail))

    def to_dict(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}


@runtime_checkable
class JobTimeline(Protocol):
    """A store that keeps a bounded timeline per job (both built-in stores do)."""

    async def timeline(
        self, key: str, *, after_seq: int = 0, limit: int = TIMELINE_CAP
    ) -> tuple[list[TimelineEntry], int]:
        """Up to ``limit`` entries after ``after_seq``, oldest first, and how many were
        dropped from the front by the cap (an unknown key: no entries, none dropped)."""
        ...


def check_note(kind: str, detail: str) -> str:
    """``detail`` clipped to :data:`NOTE_LIMIT` and made storable (a request id from a
    provider may hold anything: :func:`~ai_lease.lease.storable.diagnostic`); a ValueError
    for a kind not in :data:`NOTE_KINDS` (before any I/O: a typo is the caller's bug)."""
    if kind not in NOTE_KINDS:
        raise ValueError(f"note: kind {kind!r} is not one of {', '.join(NOTE_KINDS)}")
    return diagnostic(detail, NOTE_LIMIT) or ""


@runtime_checkable
class JobNotes(Protocol):
    """A store that takes notes from outside its operations into a job's timeline (both
    built-in stores do; a worker skips the notes for a store without it)."""

    async def note(
        self,
        key: str,
        kind: str,
        detail: str,
        *,
        owner_id: str,
        token: int,
        stage: str | None = None,
    ) -> bool:
        """Append one entry of ``kind`` (one of :data:`NOTE_KINDS`, else ValueError) to an
        existing job's timeline, by the store's clock, ``detail`` clipped to
        :data:`NOTE_LIMIT`; one round trip. Not fenced: it says what happened to an old
        owner's process, often after its lease was lost. An unknown key writes nothing and
        answers False; True when written."""
        ...


def slot_waiting(entries: Sequence[TimelineEntry], job: JobState) -> TimelineEntry | None:
    """While a RUNNING job's last heartbeat put its owner in the ``slot_wait`` step: the
    timeline's note of that wait (its detail names the limit and how many were ahead), for
    ``status`` and the dashboard; else None."""
    if job.status.value != "RUNNING" or job.stage != "slot_wait":
        return None
    notes = [e for e in entries if e.kind == "slot_wait" and e.token == job.token]
    return notes[-1] if notes else None
