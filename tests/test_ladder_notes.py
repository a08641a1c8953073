"""The ladder's steps as timeline notes (ai_lease/run/isolation/ladder_notes.py), on a real
SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ai_lease.lease.base import Acquired, Fence
from ai_lease.run.isolation.ladder_notes import noting, step_note
from ai_lease.stores.sqlite.store import SQLiteStore

STEPS: list[tuple[str, dict[str, Any]]] = [
    ("term", {"pid": 42, "signal": "term", "grace_s": 10.0}),
    ("kill", {"pid": 42, "signal": "kill", "elapsed_s": 10.02}),
    ("reaped", {"pid": 42, "outcome": "kill", "elapsed_s": 10.1, "exit_code": -9}),
]


def test_each_step_reads_as_its_kind_and_a_detail_led_by_its_signal() -> None:
    """term and kill are ``terminated`` entries led by their signal; reaped says how."""
    assert [step_note(*s) for s in STEPS] == [
        ("terminated", "term: SIGTERM to pid 42, grace 10 s"),
        ("terminated", "kill: SIGKILL to pid 42 after 10.02 s"),
        ("reaped", "kill: pid 42 reaped after 10.1 s, exit code -9"),
    ]


async def test_the_steps_are_noted_in_order_under_the_stopped_owners_fence(
    tmp_path: Path,
) -> None:
    """Every step sent to the sink is in the timeline when the block ends."""
    async with SQLiteStore(tmp_path / "s.db") as store:
        got = await store.acquire("j", "node-a#1", ttl=30, max_no_progress=30)
        assert isinstance(got, Acquired)
        async with noting(store, got.fence, "call_ai") as sink:
            for step in STEPS:
                sink(*step)
        entries, _ = await store.timeline("j")
    assert [e.kind for e in entries] == ["acquired", "terminated", "terminated", "reaped"]
    assert {(e.owner_id, e.token, e.stage) for e in entries[1:]} == {
        ("node-a#1", got.fence.token, "call_ai")
    }


class _NoNotes:
    """A third-party store: no ``note``."""


class _Failing:
    def __init__(self) -> None:
        self.tried: list[str] = []

    async def note(self, key: str, kind: str, detail: str, **ids: Any) -> bool:
        self.tried.append(kind)
        raise OSError("store down")


async def test_a_store_without_notes_is_skipped_and_a_failing_one_never_stops_the_ladder() -> None:
    """No ``note``: the sink does nothing; a note that fails is logged, the next tried."""
    fence = Fence("j", "A", 1)
    async with noting(_NoNotes(), fence, None) as sink:
        sink(*STEPS[0])
    failing = _Failing()
    async with noting(failing, fence, None) as sink:
        for step in STEPS:
            sink(*step)
    assert failing.tried == ["terminated", "terminated", "reaped"]
