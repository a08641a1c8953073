"""What the job timeline draws between its marks (ai_lease/ui/timeline_spans.py): model
calls on the lane that made them, backoff waits, a lapsed lease's expiry, labels the lapse
line does not cross. Built entries, the SVG parsed back as XML."""

from __future__ import annotations

from ai_lease.job import JobState, Status
from ai_lease.ui.timeline_svg import render_timeline
from tests.test_timeline_svg import NS, TAKEN_OVER, A, B, entries, lanes, parse, text_of

CALL = "call {n} · openai gpt · request_id {rid} · client_request_id k:1:{n}"
DONE = JobState(
    key="report-42",
    status=Status.DONE,
    owner_id=B,
    token=2,
    prompt_tokens=120,
    completion_tokens=45,
    finish_reason="stop",
    finished_at=1.0,
)


def test_each_model_call_is_a_bar_on_the_lane_that_made_it() -> None:
    """A's call (cut short by the stall) and B's call (to the commit) are each a bar on
    their own lane, labelled with duration; B's, whose result the record holds, with its
    tokens and finish; the request id is in the bar's title."""
    rows = entries(
        (0, "acquired", A, 1, "attempt 1"),
        (1, "model_call", A, 1, CALL.format(n=1, rid="rid-a")),
        (31, "stalled", A, 1, "snapshot"),
        (61, "taken_over", B, 2, f"stalled from {A} token 1"),
        (62, "model_call", B, 2, CALL.format(n=1, rid="rid-b")),
        (80, "committed", B, 2, "stop"),
    )
    root = parse(render_timeline(rows, DONE, width=1600))
    old, new = lanes(root)
    assert "call 1 · 30.0 s" in text_of(old) and "rid-a" not in text_of(new)
    assert "call 1 · 18.0 s · 120+45 tok · stop" in text_of(new)
    bars = {bar.get("data-seq"): bar for bar in root.findall("s:rect[@class='call']", NS)}
    assert set(bars) == {"2", "5"} and "rid-b" in text_of(bars["5"], "s:title")
    assert float(bars["2"].get("y") or 0) < float(bars["5"].get("y") or 0)  # lane A above B


def test_a_backoff_wait_between_attempts_is_drawn() -> None:
    """A release then the next attempt's acquisition 4 s later: a backoff line on the new
    attempt's lane saying the wait, and that attempt's label says it is a retry."""
    rows = entries(
        (0, "acquired", "n#1.a", 1, "attempt 1"),
        (2, "released", "n#1.a", 1, "ProviderFailed: 503"),
        (6, "acquired", "n#2.b", 2, "attempt 2"),
        (8, "committed", "n#2.b", 2, "stop"),
    )
    root = parse(render_timeline(rows, DONE))
    (wait,) = root.findall("s:line[@class='backoff']", NS)
    assert "backoff 4.0 s" in text_of(wait, "s:title")
    assert "retry · token 2" in text_of(lanes(root)[1])


def test_a_lease_that_expired_before_its_takeover_is_marked_at_its_expiry() -> None:
    """A's last granted renewal at +15 s with a 20 s lease: its expiry is marked at +35 s
    on A's lane (the takeover at +61 s keeps its own line); without a known ttl, only the
    takeover's line."""
    root = parse(render_timeline(TAKEN_OVER, DONE, ttl=20.0))
    (expired,) = root.findall("s:g[@class='lease-expired']", NS)
    (lapse,) = root.findall(".//s:line[@class='lease-expiry']", NS)
    assert float(expired.get("data-at") or 0) == TAKEN_OVER[0].at + 35
    assert "taken over 26.0 s later" in text_of(expired, "s:title")
    line = expired.find("s:line", NS)
    assert line is not None and float(line.get("x1") or 0) < float(lapse.get("x1") or 0)
    assert not parse(render_timeline(TAKEN_OVER, DONE)).findall("s:g[@class='lease-expired']", NS)
    late = JobState(key="k", status=Status.RUNNING, heartbeat_at=5.0, lease_expires_at=25.0)
    assert parse(render_timeline(TAKEN_OVER, late)).findall("s:g[@class='lease-expired']", NS)


def test_no_label_is_crossed_by_the_lapse_line() -> None:
    """Every mark label stands clear of the takeover's lapse line, even the takeover's own
    (drawn beside it), at widths from narrow to wide."""
    for width in (320, 640, 960, 1600):
        root = parse(render_timeline(TAKEN_OVER, DONE, width=width))
        (lapse,) = root.findall(".//s:line[@class='lease-expiry']", NS)
        x = float(lapse.get("x1") or 0)
        for label in root.iter(f"{{{NS['s']}}}text"):
            if label.get("class") != "mark-label":
                continue
            centre, half = float(label.get("x") or 0), 3.0 * len(text_of(label)) + 2
            assert not centre - half < x < centre + half, (width, text_of(label), centre, x)
