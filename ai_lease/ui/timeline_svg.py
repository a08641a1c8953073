"""A job's timeline drawn as an inline SVG on the server (the first seed's section 6).

:func:`render_timeline` turns the store's entries (:class:`~ai_lease.lease.timeline.TimelineEntry`,
oldest first) into one ``<svg id="timeline">``: one lane per owner in order of first
appearance, time on the x axis in seconds since the first entry, one mark per entry —
progress-carrying renewals filled, renewals without progress hollow, refused renewals,
the stall, the takeover labelled with its new token, the rejected late write as a red cross,
the commit, and a termination ladder's steps (``terminated``: SIGTERM or SIGKILL sent to the
owner's child process; ``reaped``: the child collected). Where a lease lapsed (a takeover
after the old owner's refused renewal or stall, or one whose cause is
``expired``/``stalled``) a dashed ``<line class="lease-expiry">`` crosses the lanes at the
takeover: the entries do not carry the old lease's expiry time.

A takeover writes its stall, release, takeover, commit and rejected write within a
millisecond: marks closer than a few pixels are nudged apart (in time order, inside the
plot), and a mark's label goes above or below its lane's line where it fits, else only in
its ``<title>``, which always holds the exact time.

The DOM follows the UI contract of issue 16 (ids, classes, ``data-*``); styling is by class,
with just enough stroke/fill attributes to read standalone. No script, no external resource;
every text from the store is escaped with :func:`markupsafe.escape` and cut to a bounded
length; at most :data:`~ai_lease.lease.timeline.TIMELINE_CAP` entries are drawn.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup, escape

from ai_lease.job import JobState
from ai_lease.lease.timeline import TIMELINE_CAP, TIMELINE_KINDS, TimelineEntry
from ai_lease.ui.timeline_spans import (
    Call,
    calls,
    draw_backoffs,
    draw_calls,
    draw_expired,
    expired_at,
    lease_ttl,
)

__all__ = ["render_timeline"]

LABEL_CHARS = 32
"""A lane label's owner id is cut to this many characters (the full id is in data-owner)."""
TITLE_CHARS = 320
"""A mark's tooltip (kind, time, owner, stage, detail) is cut to this many characters."""
MIN_WIDTH, MAX_WIDTH = 320, 4000

_LEFT, _RIGHT, _TOP, _LANE, _AXIS, _GAP = 200, 28, 30, 46, 36, 12.0
_LAPSE_SIGNS = ("renew_refused", "stalled")
_LAPSE_CAUSES = ("expired", "stalled")
_PROGRESS = re.compile(r"progress \+(\d+)")
_ATTEMPT = re.compile(r"attempt (\d+)")
_PATH = '<path d="M{x} {y}{d}" {paint}/>'
_GLYPHS = {
    "acquired": '<circle cx="{x}" cy="{y}" r="5" fill="#2e7d32"/>',
    "renewed": '<circle cx="{x}" cy="{y}" r="3" fill="#1565c0"/>',
    "renewed-idle": '<circle cx="{x}" cy="{y}" r="3" fill="#fff" stroke="#777"/>',
    "renewed-alert": '<circle cx="{x}" cy="{y}" r="3" fill="#ef6c00"/>',
    "renew_refused": _PATH.replace("{d}", "m0 -6l6 10h-12z").replace(
        "{paint}", 'fill="none" stroke="#ef6c00" stroke-width="2"'
    ),
    "stalled": _PATH.replace("{d}", "m0 -7l7 7l-7 7l-7 -7z").replace("{paint}", 'fill="#ef6c00"'),
    "released": _PATH.replace("{d}", "m-5 -5h10v10h-10z").replace(
        "{paint}", 'fill="none" stroke="#777" stroke-width="2"'
    ),
    "taken_over": '<circle cx="{x}" cy="{y}" r="7" fill="#6a1b9a" stroke="#fff"/>',
    "fenced_write_rejected": _PATH.replace("{d}", "m-6 -6l12 12m0 -12l-12 12").replace(
        "{paint}", 'fill="none" stroke="#c62828" stroke-width="3"'
    ),
    "committed": _PATH.replace("{d}", "m-6 0l4 5l8 -10").replace(
        "{paint}", 'fill="none" stroke="#2e7d32" stroke-width="3"'
    ),
    "failed": _PATH.replace("{d}", "m-5 -5h10v10h-10z").replace("{paint}", 'fill="#c62828"'),
    "cancelled": _PATH.replace("{d}", "m-5 -5h10v10h-10z").replace("{paint}", 'fill="#777"'),
    "terminated": _PATH.replace("{d}", "m1 -8l-5 9h4l-1 7l5 -9h-4z").replace(
        "{paint}", 'fill="#b71c1c"'
    ),
    "reaped": _PATH.replace("{d}", "m-5 -5h10v10h-10z").replace(
        "{paint}", 'fill="none" stroke="#b71c1c" stroke-width="2"'
    ),
    # a model request sent: a small arrow pointing at the model (its ids are in the title)
    "model_call": _PATH.replace("{d}", "m-4 -5l8 5l-8 5z").replace("{paint}", 'fill="#00838f"'),
    "other": '<circle cx="{x}" cy="{y}" r="3" fill="#777"/>',
}
_LABELS = {
    "stalled": "stall",
    "fenced_write_rejected": "rejected write",
    "committed": "commit",
    "reaped": "reaped",
}
_SIGNALS = {"term": "SIGTERM", "kill": "SIGKILL"}  # a ladder step's detail starts with one


@dataclass(frozen=True, slots=True)
class _Frame:
    """Where things go: a time to an x, an owner to its lane; ``spots`` each entry's x."""

    t0: float
    span: float
    width: int
    lanes: dict[str, int]
    spots: list[float]

    def x(self, at: float) -> float:
        return _LEFT + (at - self.t0) / self.span * (self.width - _LEFT - _RIGHT)

    def y(self, owner: str) -> float:
        return _TOP + self.lanes[owner] * _LANE + _LANE / 2

    @property
    def bottom(self) -> int:
        return _TOP + len(self.lanes) * _LANE


def render_timeline(
    entries: Sequence[TimelineEntry],
    job: JobState,
    *,
    dropped: int = 0,
    width: int = 960,
    ttl: float | None = None,
) -> Markup:
    """``job``'s timeline as an inline ``<svg id="timeline">`` (see the module docstring).

    ``entries`` are the store's, oldest first; past :data:`TIMELINE_CAP` only the newest are
    drawn and the rest counted with ``dropped`` (the entries the store's cap already
    dropped), shown as "N earlier entries dropped". ``width`` (pixels) is clamped to
    320..4000. ``ttl``: the lease length, to mark where a lapsed lease expired (by default
    the record's, when it shows one). No entries: an SVG saying "no timeline yet".
    """
    width = min(max(int(width), MIN_WIDTH), MAX_WIDTH)
    shown = list(entries)[-TIMELINE_CAP:]
    dropped = max(0, dropped) + len(entries) - len(shown)
    if not shown:
        height = _TOP + _LANE + _AXIS
        body = f'<text class="empty" x="{_LEFT}" y="{_TOP + _LANE // 2}">no timeline yet</text>'
        return Markup(_open(job, width, height) + _note(dropped) + body + _EMPTY_AXIS + "</svg>")
    frame = _frame(shown, width)
    lapses = list(_lapses(shown))
    made = calls(shown, job)
    parts = [_open(job, width, frame.bottom + _AXIS), _note(dropped)]
    parts += _lanes(shown, frame, [frame.spots[i] for i, _ in lapses], made)
    parts += draw_calls(shown, frame, made)
    parts += draw_backoffs(shown, frame)
    parts += _expiries(shown, frame, lapses, lease_ttl(job) if ttl is None else ttl)
    parts.append(_axis(frame))
    parts.append("</svg>")
    return Markup("".join(parts))


_EMPTY_AXIS = '<g class="axis"></g>'


def _num(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _esc(text: str, limit: int) -> str:
    """Store text, bounded and escaped for an element's text or a quoted attribute."""
    return str(escape(_cut(text, limit)))


def _frame(entries: list[TimelineEntry], width: int) -> _Frame:
    times = [e.at for e in entries]
    t0 = min(times)
    lanes: dict[str, int] = {}
    for entry in entries:
        lanes.setdefault(entry.owner_id, len(lanes))
    frame = _Frame(t0, max(times) - t0 or 1.0, width, lanes, [])
    frame.spots.extend(_dodge([frame.x(at) for at in times], _LEFT, width - _RIGHT))
    return frame


def _dodge(raw: list[float], low: float, high: float) -> list[float]:
    """Each mark's x: its time's, pushed right just enough to stand a few pixels from the
    one before it in time and pulled back inside ``high``, so the handful of entries a
    takeover writes within a millisecond stay apart; the order in time is kept."""
    order = sorted(range(len(raw)), key=raw.__getitem__)
    gap = min(_GAP, (high - low) / max(len(raw) - 1, 1))
    spots, before = list(raw), -math.inf
    for i in order:
        spots[i] = before = max(raw[i], before + gap)
    after = high + gap
    for i in reversed(order):
        spots[i] = after = min(spots[i], after - gap)
    return spots


class _Shelves:
    """Where a lane's mark labels go: above the line, else below, else nowhere (the
    mark's title still says it), never over another label."""

    ROWS = (-11.0, 20.0)

    def __init__(self, width: int, lines: Sequence[float] = ()) -> None:
        self.width, self.ends = width, dict.fromkeys(self.ROWS, -math.inf)
        self.lines = lines  # the lapse lines' x: no label is put across one

    def place(self, x: float, text: str) -> tuple[float, float] | None:
        """The (centre x, y offset) for ``text`` under a mark at ``x``, or None."""
        half = 3.0 * len(text) + 2
        centre = min(max(x, half + 2), self.width - half - 2)
        for line in self.lines:  # beside the line: the mark's side of it, else the other
            if centre - half - 3 <= line <= centre + half + 3:
                sides = (line - half - 4, line + half + 4)
                fits = [c for c in (sides if x < line else sides[::-1]) if self._inside(c, half)]
                if not fits:
                    return None
                centre = fits[0]
        for row, end in self.ends.items():  # above the line, else below
            if centre - half > end:
                self.ends[row] = centre + half
                return centre, row
        return None

    def _inside(self, centre: float, half: float) -> bool:
        return centre - half >= 2 and centre + half <= self.width - 2


def _open(job: JobState, width: int, height: int) -> str:
    key, status = _esc(job.key, 200), _esc(job.status.value, 20)
    return (
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" role="img" width="{width}"'
        f' height="{height}" viewBox="0 0 {width} {height}" data-key="{key}"'
        f' data-status="{status}" aria-label="timeline of job {key}"'
        f' font-family="sans-serif" font-size="11">'
        f"<title>timeline of job {key} ({status})</title>"
    )


def _note(dropped: int) -> str:
    if dropped <= 0:
        return ""
    return (
        f'<text class="dropped" x="8" y="16" fill="#777" data-dropped="{dropped}">'
        f"{dropped} earlier entries dropped</text>"
    )


def _lanes(
    entries: list[TimelineEntry], frame: _Frame, lines: list[float], made: list[Call]
) -> Iterator[str]:
    """One ``<g class="lane">`` per owner: its band, line, label and marks (labels kept off
    the lapse ``lines``; a model call's says its duration, tokens and finish)."""
    said = {call.index: _esc(call.label, LABEL_CHARS + 16) for call in made}
    for owner, index in frame.lanes.items():
        mine = [i for i, e in enumerate(entries) if e.owner_id == owner]
        top, y = _TOP + index * _LANE, _num(frame.y(owner))
        band = "#f7f7f7" if index % 2 == 0 else "#ffffff"
        yield (
            f'<g class="lane" data-owner="{_esc(owner, 200)}" data-lane="{index}">'
            f'<rect class="lane-band" x="0" y="{top}" width="{frame.width}" height="{_LANE}"'
            f' fill="{band}"/>'
            f'<line class="lane-line" x1="{_LEFT}" y1="{y}" x2="{frame.width - _RIGHT}"'
            f' y2="{y}" stroke="#bbb"/>'
            f"{_label(owner, [entries[i] for i in mine], top)}"
        )
        shelves = _Shelves(frame.width, lines)
        yield from (_mark(entries[i], frame.spots[i], frame, shelves, said.get(i)) for i in mine)
        yield "</g>"


def _label(owner: str, mine: list[TimelineEntry], top: int) -> str:
    """The lane's label: its owner id on one line, the token(s) it held on the next."""
    tokens = list(dict.fromkeys(e.token for e in mine))
    said = ", ".join(str(t) for t in tokens[:3]) + (", …" if len(tokens) > 3 else "")
    held = _esc(f"token{'s' if len(tokens) > 1 else ''} {said}", LABEL_CHARS)
    return (
        f'<text class="lane-label" x="8" y="{top + 19}">{_esc(owner or "-", LABEL_CHARS)}'
        f'<tspan class="lane-tokens" x="8" dy="14" fill="#555">{held}</tspan></text>'
    )


def _mark(
    entry: TimelineEntry, x: float, frame: _Frame, shelves: _Shelves, said: str | None = None
) -> str:
    """One entry's ``<g class="mark mark-KIND">`` at ``x``: its glyph, a label for the
    notable ones (where there is room), and a ``<title>`` saying kind, time, owner, token,
    stage and detail."""
    kind = entry.kind if entry.kind in TIMELINE_KINDS else "other"
    y = frame.y(entry.owner_id)
    glyph, extra = _glyph(entry, kind)
    label = said or _mark_label(entry, kind)
    spot = shelves.place(x, label) if label else None
    text = (
        f'<text class="mark-label" x="{_num(spot[0])}" y="{_num(y + spot[1])}"'
        f' text-anchor="middle" font-size="10" fill="#333">{label}</text>'
        if spot
        else ""
    )
    return (
        f'<g class="mark mark-{kind}{extra}" data-seq="{_esc(str(entry.seq), 24)}"'
        f' data-token="{_esc(str(entry.token), 24)}">'
        f"<title>{_title(entry, frame)}</title>{glyph.format(x=_num(x), y=_num(y))}{text}</g>"
    )


def _glyph(entry: TimelineEntry, kind: str) -> tuple[str, str]:
    """The glyph template and extra classes: a renewal says whether progress moved."""
    if kind != "renewed":  # a kind this drawing does not know yet is drawn, not a 500
        return _GLYPHS.get(kind, _GLYPHS["other"]), ""
    if "stalled (alert)" in entry.detail:
        return _GLYPHS["renewed-alert"], " stalled-alert"
    moved = _PROGRESS.search(entry.detail)
    if moved is not None and int(moved.group(1)) == 0:
        return _GLYPHS["renewed-idle"], " no-progress"
    return _GLYPHS["renewed"], " progress" if moved else ""


def _mark_label(entry: TimelineEntry, kind: str) -> str:
    if kind in ("acquired", "taken_over"):
        attempt = _ATTEMPT.match(entry.detail)
        again = attempt is not None and int(attempt.group(1)) > 1
        return _esc(f"{'retry · ' if again else ''}token {entry.token}", LABEL_CHARS)
    if kind == "terminated":  # the ladder's signal: "term: …" or "kill: …"
        return _SIGNALS.get(entry.detail.partition(":")[0], "signal")
    return _LABELS.get(kind, "")


def _title(entry: TimelineEntry, frame: _Frame) -> str:
    when = datetime.fromtimestamp(entry.at, UTC).isoformat(timespec="milliseconds")[:-6]
    parts = [
        f"{entry.kind.replace('_', ' ')} at +{entry.at - frame.t0:.2f} s ({when}Z)",
        f"{entry.owner_id or '-'} token {entry.token}",
        *([f"stage {entry.stage}"] if entry.stage else []),
        *([entry.detail] if entry.detail else []),
    ]
    return _esc(" · ".join(parts), TITLE_CHARS)


def _lapses(entries: list[TimelineEntry]) -> Iterator[tuple[int, str]]:
    """The takeovers (their index) that followed a lapsed lease, with the owner whose
    lease lapsed."""
    troubled: set[str] = set()
    holder: str | None = None
    for index, entry in enumerate(entries):
        if entry.kind in _LAPSE_SIGNS:
            troubled.add(entry.owner_id)
        if entry.kind == "taken_over" and holder is not None and holder != entry.owner_id:
            if holder in troubled or entry.detail.startswith(_LAPSE_CAUSES):
                yield index, holder
        if entry.kind in ("acquired", "taken_over"):
            holder = entry.owner_id


def _expiries(
    entries: list[TimelineEntry], frame: _Frame, lapses: list[tuple[int, str]], ttl: float | None
) -> Iterator[str]:
    """A dashed ``<line class="lease-expiry">`` across the lanes at each lapse's takeover;
    where the lease expired before it (``ttl`` known), a ``<line class="lease-expired">``
    on the lapsed lane at the expiry and a band to the takeover."""
    for index, lapsed in lapses:
        entry, x = entries[index], _num(frame.spots[index])
        why = f"lease of {lapsed or '-'} lapsed; taken over by {entry.owner_id or '-'}"
        yield (
            f'<line class="lease-expiry" data-seq="{entry.seq}" x1="{x}" y1="{_TOP - 4}"'
            f' x2="{x}" y2="{frame.bottom + 4}" stroke="#c62828" stroke-dasharray="4 3">'
            f"<title>{_esc(why, TITLE_CHARS)}</title></line>"
        )
        at = expired_at(entries, index, lapsed, ttl)
        if at is not None:
            yield draw_expired(frame, lapsed, at, frame.spots[index], entry.at - at)


def _ticks(span: float) -> Iterator[float]:
    """About five round steps (1, 2 or 5 times a power of ten) from 0 to ``span``."""
    raw = span / 5
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    count = int(span / step + 1e-9)
    return (round(i * step, 9) for i in range(count + 1))


def _axis(frame: _Frame) -> str:
    """The x axis: a base line and ticks in seconds since the first entry."""
    y = frame.bottom + 8
    parts = [
        f'<g class="axis"><line x1="{_LEFT}" y1="{y}" x2="{frame.width - _RIGHT}" y2="{y}"'
        f' stroke="#333"/>'
        f'<text class="axis-label" x="{_LEFT - 8}" y="{y + 16}" text-anchor="end"'
        f' fill="#555">s since first entry</text>'
    ]
    for tick in _ticks(frame.span):
        x = _num(frame.x(frame.t0 + tick))
        parts.append(
            f'<line class="tick" x1="{x}" y1="{y}" x2="{x}" y2="{y + 5}" stroke="#333"/>'
            f'<text class="tick-label" x="{x}" y="{y + 16}" text-anchor="middle"'
            f' fill="#555">{tick:g}</text>'
        )
    parts.append("</g>")
    return "".join(parts)
