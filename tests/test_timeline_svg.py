"""The job timeline as an inline SVG (ai_lease/ui/timeline_svg.py), parsed back as XML.

Built entries pin the drawing (lanes, marks, the lapse, escaping, bounds); one real
takeover — two Runners on a real SQLite store, the first one's stream stalled — pins that
what the store writes draws as the first seed's section-6 picture."""

from __future__ import annotations

import asyncio
import time
import xml.etree.ElementTree as ET
from itertools import count, pairwise

import pytest

from ai_lease import LeaseTimings, StageBudget
from ai_lease.errors import FencingRejected
from ai_lease.job import Job, JobState, Status
from ai_lease.lease.base import Fence
from ai_lease.lease.timeline import TIMELINE_CAP, TIMELINE_KINDS, TimelineEntry
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.scripted import ScriptedProvider, Stall
from ai_lease.ui.timeline_svg import render_timeline

NS = {"s": "http://www.w3.org/2000/svg"}
T0 = 1_764_000_000.0
A, B = "node-a#1.f00d", "node-b#1.beef"
JOB = JobState(key="report-42", status=Status.DONE, owner_id=B, token=2)


def entries(*rows: tuple[float, str, str, int, str]) -> list[TimelineEntry]:
    """Entries from (seconds after T0, kind, owner, token, detail), seq from 1."""
    seq = count(1)
    return [TimelineEntry(next(seq), T0 + t, k, o, tok, "call_ai", d) for t, k, o, tok, d in rows]


TAKEN_OVER = entries(
    (0, "acquired", A, 1, "attempt 1"),
    (5, "renewed", A, 1, "progress +2"),
    (10, "renewed", A, 1, "progress +1"),
    (15, "renewed", A, 1, "progress +0"),
    (30, "renew_refused", A, 1, "no_progress"),
    (31, "stalled", A, 1, "snapshot stored: File stage.py, line 3"),
    (61, "taken_over", B, 2, f"expired from {A} token 1"),
    (70, "fenced_write_rejected", A, 1, "newer_owner"),
    (80, "committed", B, 2, "stop"),
)


def parse(svg: object) -> ET.Element:
    root = ET.fromstring(str(svg))
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and root.get("id") == "timeline"
    return root


def lanes(root: ET.Element) -> list[ET.Element]:
    return root.findall("s:g[@class='lane']", NS)


def marks(element: ET.Element, kind: str | None = None) -> list[ET.Element]:
    found = [g for g in element.iter(f"{{{NS['s']}}}g") if "mark" in (g.get("class") or "").split()]
    return [g for g in found if kind is None or f"mark-{kind}" in (g.get("class") or "").split()]


def text_of(element: ET.Element | None, path: str | None = None) -> str:
    """The text of ``element`` (or of its first ``path`` match), which must exist."""
    found = element if path is None or element is None else element.find(path, NS)
    assert found is not None, f"no {path} in the SVG"
    return "".join(found.itertext())


def test_lanes_are_the_distinct_owners_in_order_of_first_appearance() -> None:
    """One lane per owner id, in the order each first appears, labelled with its tokens."""
    rows = entries(
        (0, "acquired", "c", 1, ""), (1, "taken_over", "a", 2, ""), (2, "renewed", "c", 1, "")
    )
    root = parse(render_timeline(rows, JOB))
    assert [lane.get("data-owner") for lane in lanes(root)] == ["c", "a"]
    labels = [text_of(lane, "s:text[@class='lane-label']") for lane in lanes(root)]
    assert labels[0].startswith("c") and "token 1" in labels[0] and "token 2" in labels[1]


def test_a_taken_over_job_draws_both_owners_the_takeover_and_the_rejected_write() -> None:
    """Two lanes; the late rejected write in the old owner's, the takeover (token 2) and the
    commit in the new one's; every entry a mark with its seq and token."""
    root = parse(render_timeline(TAKEN_OVER, JOB))
    old, new = lanes(root)
    assert (old.get("data-owner"), new.get("data-owner")) == (A, B)
    (rejected,) = marks(old, "fenced_write_rejected")
    assert rejected.get("data-token") == "1" and "newer_owner" in text_of(rejected)
    (takeover,) = marks(new, "taken_over")
    assert takeover.get("data-token") == "2" and "token 2" in text_of(takeover)
    assert len(marks(new, "committed")) == 1 and not marks(new, "fenced_write_rejected")
    assert len(marks(old)) == 7 and len(marks(new)) == 2


def test_a_lapsed_lease_draws_its_expiry_at_the_takeover() -> None:
    """A refused renewal then a takeover by another owner: one lease-expiry line, at the
    takeover's x, crossing the lanes."""
    root = parse(render_timeline(TAKEN_OVER, JOB))
    (line,) = root.findall(".//s:line[@class='lease-expiry']", NS)
    (takeover,) = marks(root, "taken_over")
    circle = takeover.find("s:circle", NS)
    assert circle is not None and line.get("x1") == line.get("x2") == circle.get("cx")
    assert float(line.get("y2") or 0) - float(line.get("y1") or 0) > 2 * 40


def test_a_released_handover_draws_no_lease_expiry() -> None:
    """A takeover after a release is no lapse: no lease-expiry line."""
    rows = entries(
        (0, "acquired", A, 1, "attempt 1"),
        (2, "released", A, 1, "interrupted"),
        (3, "taken_over", B, 2, f"released from {A} token 1"),
    )
    assert not parse(render_timeline(rows, JOB)).findall(".//s:line[@class='lease-expiry']", NS)


def test_marks_move_right_as_time_passes() -> None:
    """The x of each mark grows with its entry's time; the axis ticks count seconds from 0."""
    root = parse(render_timeline(TAKEN_OVER, JOB, width=1200))
    by_seq = {int(m.get("data-seq") or 0): m for m in marks(root)}
    xs = []
    for seq in sorted(by_seq):
        shape = by_seq[seq].find("s:circle", NS)
        xs.append(float(shape.get("cx") or 0) if shape is not None else None)
    circles = [x for x in xs if x is not None]
    assert len(circles) >= 5 and circles == sorted(circles) and len(set(circles)) == len(circles)
    axis = root.find("s:g[@class='axis']", NS)
    assert axis is not None
    ticks = [text_of(t) for t in axis.findall("s:text[@class='tick-label']", NS)]
    assert ticks[0] == "0" and float(ticks[-1]) <= 80 and 3 <= len(ticks) <= 12


def test_a_burst_within_a_millisecond_stays_apart_and_in_order() -> None:
    """The stall, release, takeover and commit a takeover writes within a millisecond are
    drawn apart, in their order, inside the plot; their labels never overlap."""
    rows = entries(
        (0, "acquired", A, 1, "attempt 1"),
        (60, "stalled", A, 1, "snapshot stored"),
        (60.0002, "released", A, 1, "interrupted"),
        (60.0004, "taken_over", B, 2, f"released from {A} token 1"),
        (60.0006, "committed", B, 2, "stop"),
        (60.0008, "fenced_write_rejected", A, 1, "already_committed"),
    )
    root = parse(render_timeline(rows, JOB, width=800))
    spots = {int(m.get("data-seq") or 0): mark_x(m) for m in marks(root)}
    xs = [spots[seq] for seq in sorted(spots)]
    assert all(b - a >= 8 for a, b in pairwise(xs)) and xs[-1] <= 800
    for lane in lanes(root):
        labels = sorted(
            (float(t.get("x") or 0), float(t.get("y") or 0), len(text_of(t)))
            for t in lane.iter(f"{{{NS['s']}}}text")
            if t.get("class") == "mark-label"
        )
        for (x1, y1, n1), (x2, y2, n2) in pairwise(labels):
            assert y1 != y2 or x2 - x1 >= 3 * (n1 + n2), labels


def mark_x(mark: ET.Element) -> float:
    """Where a mark stands: its circle's centre, or its path's first point."""
    circle = mark.find("s:circle", NS)
    if circle is not None:
        return float(circle.get("cx") or 0)
    path = mark.find("s:path", NS)
    assert path is not None
    return float((path.get("d") or "").removeprefix("M").split()[0])


def test_renewals_say_whether_progress_moved() -> None:
    """A renewal that carried progress is drawn apart from one that carried none."""
    root = parse(render_timeline(TAKEN_OVER, JOB))
    classes = [m.get("class") for m in marks(root, "renewed")]
    assert classes == ["mark mark-renewed progress"] * 2 + ["mark mark-renewed no-progress"]


def test_store_text_renders_as_text_never_markup() -> None:
    """An owner, detail or key holding ``<script>`` and ``&`` parses back as the same text,
    with no script element anywhere."""
    evil = '<script>alert("x")</script>&amp;'
    rows = entries((0, "acquired", evil, 1, evil), (1, "committed", evil, 1, "done & <b>"))
    svg = render_timeline(rows, JobState(key=evil, status=Status.DONE))
    root = parse(svg)
    assert not [e for e in root.iter() if e.tag.rsplit("}", 1)[-1] in ("script", "b")]
    (lane,) = lanes(root)
    assert lane.get("data-owner") == evil and root.get("data-key") == evil
    label = lane.find("s:text[@class='lane-label']", NS)
    assert label is not None and text_of(label).startswith(evil[:20])
    titles = [text_of(m, "s:title") for m in marks(root)]
    assert evil in titles[0] and "done & <b>" in titles[1]


def test_an_empty_timeline_says_so() -> None:
    """No entries: a valid SVG saying "no timeline yet"."""
    root = parse(render_timeline([], JobState(key="new", status=Status.PENDING)))
    assert "no timeline yet" in text_of(root) and not marks(root) and not lanes(root)


def test_dropped_entries_are_counted() -> None:
    """Entries the store's cap dropped are said, with their number."""
    root = parse(render_timeline(TAKEN_OVER, JOB, dropped=37))
    (note,) = root.findall("s:text[@class='dropped']", NS)
    assert text_of(note) == "37 earlier entries dropped"
    assert not parse(render_timeline(TAKEN_OVER, JOB)).findall("s:text[@class='dropped']", NS)


def test_more_than_the_cap_draws_only_the_newest() -> None:
    """Past TIMELINE_CAP entries the oldest are left out and counted; labels and the width
    stay bounded."""
    rows = entries(*((i, "renewed", "o" * 500, 1, "x" * 5000) for i in range(TIMELINE_CAP + 50)))
    svg = render_timeline(rows, JOB, dropped=10, width=10**6)
    root = parse(svg)
    assert len(marks(root)) == TIMELINE_CAP and marks(root)[0].get("data-seq") == "51"
    assert text_of(root, "s:text[@class='dropped']") == "60 earlier entries dropped"
    assert int(root.get("width") or 0) <= 4000
    assert len(text_of(root, ".//s:text[@class='lane-label']")) < 60
    assert len(str(svg)) < 200_000


def test_two_hundred_entries_render_fast() -> None:
    """A full timeline (the cap, 200 entries, two owners) renders in well under 50 ms."""
    more = TIMELINE_CAP - len(TAKEN_OVER)
    rows = entries(
        *((e.at - T0, e.kind, e.owner_id, e.token, e.detail) for e in TAKEN_OVER),
        *((100 + i, "renewed", B, 2, f"progress +{i % 3}") for i in range(more)),
    )
    render_timeline(rows, JOB)  # warm
    started = time.perf_counter()
    for _ in range(5):
        svg = render_timeline(rows, JOB)
    # real: the render's CPU time is what is bounded
    assert (time.perf_counter() - started) / 5 < 0.05
    root = parse(svg)
    assert len(marks(root)) == TIMELINE_CAP and not root.findall("s:text[@class='dropped']", NS)


FAST = LeaseTimings(
    ttl=1.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.2,
    stage_budgets={"call_ai": StageBudget(0.5, 10)},
)


async def test_a_real_takeover_draws_the_zombie_and_its_successor(
    sqlite_store: SQLiteStore,
) -> None:
    """A stalled stream's owner loses the job to a second runner; its late commit is
    rejected. The store's own timeline draws two lanes (zombie, then successor), the
    takeover labelled with its new (higher) token in the successor's, the rejected write in
    the zombie's, and the lapse."""
    stalled = asyncio.Event()
    zombie = Runner(
        sqlite_store,
        provider=ScriptedProvider(["x", Stall()]),
        config=RunConfig(timings=FAST, node_id="zombie"),
        hooks=RunHooks(on_event=lambda e: stalled.set() if e.kind == "stalled" else None),
    )
    good = Runner(
        sqlite_store,
        provider=ScriptedProvider(["good"]),
        config=RunConfig(timings=FAST, node_id="good"),
    )
    zombie_run = asyncio.create_task(zombie.run(Job("k", input="x")))
    await asyncio.sleep(0.1)  # real: a takeover on a real store (its thread, its clock)
    good_run = asyncio.create_task(good.run(Job("k", input="x")))
    await asyncio.wait_for(stalled.wait(), 5)
    zombie_run.cancel()
    record = await asyncio.wait_for(good_run, 10)
    with pytest.raises(asyncio.CancelledError):
        await zombie_run
    rows, dropped = await sqlite_store.timeline("k")
    first = rows[0]
    with pytest.raises(FencingRejected):  # the zombie's late write
        await sqlite_store.commit(Fence("k", first.owner_id, first.token), '"late"')
    rows, dropped = await sqlite_store.timeline("k")
    root = parse(render_timeline(rows, record, dropped=dropped))
    owners = [lane.get("data-owner") or "" for lane in lanes(root)]
    assert len(owners) == 2 and owners[0].startswith("zombie#") and owners[1].startswith("good#")
    old, new = lanes(root)
    assert marks(old, "fenced_write_rejected") and marks(new, "committed")
    (takeover,) = marks(new, "taken_over")
    label = takeover.find("s:text[@class='mark-label']", NS)
    assert label is not None and text_of(label) == f"token {record.token}"
    assert takeover.get("data-token") == str(record.token) and record.token > first.token
    assert root.findall(".//s:line[@class='lease-expiry']", NS)


def test_a_termination_ladders_steps_are_drawn_in_the_old_owners_lane() -> None:
    """``terminated`` (labelled by its signal) and ``reaped`` entries, noted by the worker
    after the takeover under the old owner's fence, are marks of their own in its lane."""
    rows = entries(
        (0, "acquired", A, 1, "attempt 1"),
        (31, "stalled", A, 1, "snapshot stored"),
        (31.5, "terminated", A, 1, "term: SIGTERM to pid 42, grace 10 s"),
        (41.5, "terminated", A, 1, "kill: SIGKILL to pid 42 after 10 s"),
        (41.6, "reaped", A, 1, "kill: pid 42 reaped after 10.1 s, exit code -9"),
        (61, "taken_over", B, 2, f"expired from {A} token 1"),
    )
    old, _ = lanes(parse(render_timeline(rows, JOB, width=1200)))
    signals = marks(old, "terminated")
    assert [text_of(m, "s:text[@class='mark-label']") for m in signals] == ["SIGTERM", "SIGKILL"]
    (reaped,) = marks(old, "reaped")
    assert "exit code -9" in text_of(reaped, "s:title")
    assert not marks(old, "other")


@pytest.mark.parametrize("kind", TIMELINE_KINDS)
def test_every_kind_a_store_can_write_has_its_own_mark(kind: str) -> None:
    """Each kind in TIMELINE_KINDS (a model call's ids among them) is drawn with a glyph of
    its own, never a 500 for the job page and never the anonymous 'other' mark."""
    rows = entries((0, "acquired", A, 1, "attempt 1"), (1, kind, A, 1, "detail of it"))
    root = parse(render_timeline(rows, JOB, width=1200))
    assert marks(root, kind) and not marks(root, "other"), kind


def test_a_kind_not_known_yet_is_drawn_as_other() -> None:
    """An entry of a kind this version does not know (written by a newer node) is drawn as
    the neutral mark: the page still renders."""
    rows = entries((0, "acquired", A, 1, "attempt 1"), (1, "from_the_future", A, 1, "?"))
    root = parse(render_timeline(rows, JOB, width=1200))
    assert marks(root, "other") and "from the future" in text_of(marks(root, "other")[0], "s:title")
