"""What a job's timeline draws between its marks: each model call as a bar on the lane that
made it, the backoff waits between attempts, and where a lapsed lease expired.

A ``model_call`` entry says when a call was sent and its ids; the call lasts until its
owner's next entry that ends or replaces it (another call, the commit, a failure, a
release, a stall). Its tokens and finish reason are the record's, so they are told only
for the call the committing (or failing) owner made last. A backoff is the time from a
release to the next acquisition. A lapsed lease expired ``ttl`` seconds after its owner's
last granted acquisition or renewal: drawn only when the lease's ``ttl`` is known and the
expiry comes before the takeover (else the takeover's line says it all).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from markupsafe import escape

from ai_lease.job import JobState
from ai_lease.lease.timeline import TimelineEntry

__all__ = [
    "Call",
    "backoffs",
    "calls",
    "draw_backoffs",
    "draw_calls",
    "draw_expired",
    "expired_at",
    "lease_ttl",
]

TITLE_CHARS = 320
_LANE, _RIGHT = 46, 28  # timeline_svg's lane height and right margin


class Frame(Protocol):
    """Where things go on the timeline (timeline_svg's frame)."""

    @property
    def t0(self) -> float: ...

    @property
    def width(self) -> int: ...

    @property
    def spots(self) -> list[float]: ...

    def x(self, at: float) -> float: ...

    def y(self, owner: str) -> float: ...


def _num(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _esc(text: str) -> str:
    return str(escape(text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"))


_ENDS = ("model_call", "committed", "failed", "released", "stalled", "renew_refused")
_EXTENDS = ("acquired", "taken_over", "renewed")
_CALL_NO = re.compile(r"^call (\d+)")
_REQUEST = re.compile(r"request_id (\S+)")


@dataclass(frozen=True, slots=True)
class Call:
    """One model call: its entry's index, when it ended (None: still running), its label."""

    index: int
    end: float | None
    label: str
    request_id: str


def calls(entries: Sequence[TimelineEntry], job: JobState) -> list[Call]:
    """The model calls in ``entries``, each with its end and a label: ``call N · 2.3 s``,
    with ``· 120+45 tok · stop`` for the call whose result the record holds."""
    found = []
    last = _last_call_of(entries, job)
    for index, entry in enumerate(entries):
        if entry.kind != "model_call":
            continue
        end = next(
            (
                e.at
                for e in entries[index + 1 :]
                if e.owner_id == entry.owner_id and e.kind in _ENDS
            ),
            None,
        )
        number = _CALL_NO.match(entry.detail)
        parts = [f"call {number.group(1)}" if number else "call"]
        parts.append(f"{end - entry.at:.1f} s" if end is not None else "running")
        if index == last:
            parts += _usage(job)
        request = _REQUEST.search(entry.detail)
        found.append(Call(index, end, " · ".join(parts), request.group(1) if request else ""))
    return found


def _last_call_of(entries: Sequence[TimelineEntry], job: JobState) -> int | None:
    """The index of the last call by the owner that committed or failed the job."""
    ender = next((e.owner_id for e in reversed(entries) if e.kind in ("committed", "failed")), None)
    if ender is None or job.finished_at is None:
        return None
    mine = [i for i, e in enumerate(entries) if e.kind == "model_call" and e.owner_id == ender]
    return mine[-1] if mine else None


def _usage(job: JobState) -> list[str]:
    parts = []
    if job.prompt_tokens is not None or job.completion_tokens is not None:
        parts.append(f"{job.prompt_tokens or 0}+{job.completion_tokens or 0} tok")
    if job.finish_reason:
        parts.append(job.finish_reason)
    return parts


def backoffs(entries: Sequence[TimelineEntry]) -> Iterator[tuple[int, int]]:
    """(release index, next acquisition index) for each wait between attempts."""
    released: int | None = None
    for index, entry in enumerate(entries):
        if entry.kind == "released":
            released = index
        elif entry.kind in ("acquired", "taken_over"):
            if released is not None and entry.at > entries[released].at:
                yield released, index
            released = None


def expired_at(
    entries: Sequence[TimelineEntry], takeover: int, lapsed: str, ttl: float | None
) -> float | None:
    """When ``lapsed``'s lease expired before the takeover at index ``takeover``: its last
    granted acquisition or renewal plus ``ttl``; None if unknown or not before the takeover."""
    if ttl is None or ttl <= 0:
        return None
    granted = [e.at for e in entries[:takeover] if e.owner_id == lapsed and e.kind in _EXTENDS]
    if not granted or granted[-1] + ttl >= entries[takeover].at:
        return None
    return granted[-1] + ttl


def lease_ttl(job: JobState) -> float | None:
    """The lease length the record shows: a running job's expiry minus its last heartbeat
    (each grant sets both); None when the record does not say (a finished job)."""
    if job.lease_expires_at is None or job.heartbeat_at is None:
        return None
    ttl = job.lease_expires_at - job.heartbeat_at
    return ttl if ttl > 0 else None


def draw_expired(frame: Frame, lapsed: str, at: float, until: float, late: float) -> str:
    """The lapsed lease's expiry on its lane, and the wait until the takeover."""
    x, top = frame.x(at), frame.y(lapsed) - _LANE / 2 + 3
    why = (
        f"lease of {lapsed or '-'} expired at +{at - frame.t0:.2f} s; taken over {late:.1f} s later"
    )
    return (
        f'<g class="lease-expired" data-at="{at:.3f}"><title>{_esc(why)}</title>'
        f'<rect class="lapsed" x="{_num(x)}" y="{_num(top)}" width="{_num(max(until - x, 1))}"'
        f' height="{_LANE - 6}" fill="#c62828" fill-opacity="0.08"/>'
        f'<line x1="{_num(x)}" y1="{_num(top)}" x2="{_num(x)}" y2="{_num(top + _LANE - 6)}"'
        f' stroke="#c62828" stroke-width="2"/></g>'
    )


def draw_calls(entries: Sequence[TimelineEntry], frame: Frame, made: list[Call]) -> Iterator[str]:
    """Each model call as a bar under its lane's line, from its sending to its end."""
    for call in made:
        entry = entries[call.index]
        x0, below = frame.spots[call.index], frame.y(entry.owner_id) + 6
        x1 = frame.x(call.end) if call.end is not None else frame.width - _RIGHT
        title = f"{call.label} · request_id {call.request_id or '-'}"
        yield (
            f'<rect class="call" data-seq="{entry.seq}" x="{_num(x0)}" y="{_num(below)}"'
            f' width="{_num(max(x1 - x0, 2))}" height="4" fill="#00838f" fill-opacity="0.5">'
            f"<title>{_esc(title)}</title></rect>"
        )


def draw_backoffs(entries: Sequence[TimelineEntry], frame: Frame) -> Iterator[str]:
    """Each backoff as a dashed line on the lane of the attempt that waited for it."""
    for released, acquired in backoffs(entries):
        start, end = entries[released], entries[acquired]
        x0, x1 = frame.spots[released], frame.spots[acquired]
        y = _num(frame.y(end.owner_id))
        wait = f"backoff {end.at - start.at:.1f} s before the next attempt"
        yield (
            f'<line class="backoff" x1="{_num(x0)}" y1="{y}" x2="{_num(x1)}" y2="{y}"'
            f' stroke="#ef6c00" stroke-width="2" stroke-dasharray="2 3">'
            f"<title>{_esc(wait)}</title></line>"
        )
