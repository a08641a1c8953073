"""The job-timeline contract: a store that keeps timelines (:class:`JobTimeline`) passes it.

Each lease operation notes what it did in the job's timeline, inside the operation itself
(one script, one transaction): these tests read the timeline back after each kind of event.
``note`` appends what happened outside the store (a termination ladder's steps).
Use it like :class:`~ai_lease.testing.contract.LeaseStoreContract` (a ``store`` fixture).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ai_lease.errors import FencingRejected
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import Acquired
from ai_lease.lease.timeline import NOTE_LIMIT, TIMELINE_CAP, JobNotes, JobTimeline, TimelineEntry
from ai_lease.testing.contract_support import key_for, own, renew

__all__ = ["TimelineContract"]


async def _entries(store: Any, key: str, **kw: Any) -> list[TimelineEntry]:
    assert isinstance(store, JobTimeline)
    entries, _ = await store.timeline(key, **kw)
    return entries


def _kinds(entries: list[TimelineEntry]) -> list[str]:
    return [e.kind for e in entries]


def _notes(store: Any) -> JobNotes:
    assert isinstance(store, JobNotes), "the store takes notes into timelines (JobNotes)"
    return store


class TimelineContract:
    """What every store that keeps job timelines promises."""

    async def test_a_short_job_reads_acquired_renewed_committed(self, store: Any) -> None:
        """In order, numbered from 1, by the store's clock, each with its owner and token;
        the renewal carries its stage and how far progress moved since the last one."""
        key = key_for("tl-short")
        fence = await own(store, key, "A")
        assert (await renew(store, fence, 3)).ok
        assert (await renew(store, fence, 5)).ok
        await store.commit(fence, "answer", finish_reason="stop")
        entries, dropped = await store.timeline(key)
        assert dropped == 0
        assert _kinds(entries) == ["acquired", "renewed", "renewed", "committed"]
        assert [e.seq for e in entries] == [1, 2, 3, 4]
        assert all(e.owner_id == "A" and e.token == fence.token for e in entries)
        assert [e.detail for e in entries] == ["attempt 1", "progress +3", "progress +2", "stop"]
        assert entries[1].stage == "call_ai" and entries[3].stage == "done"
        times = [e.at for e in entries]
        assert times == sorted(times) and times[0] > 1_600_000_000

    async def test_a_takeover_and_the_old_owners_rejected_writes(self, store: Any) -> None:
        """The new owner's entry says ``taken_over`` (why, from whom) under its new token;
        the old owner's refused renewal and rejected commit are noted with its own fence."""
        key = key_for("tl-takeover")
        old = await own(store, key, "node-a#1", ttl=0.2)
        await asyncio.sleep(0.35)
        won = await store.acquire(key, "node-b#1", ttl=30, max_no_progress=30)
        assert isinstance(won, Acquired) and won.takeover
        refused = await renew(store, old, 1)
        assert not refused.ok
        with pytest.raises(FencingRejected):
            await store.commit(old, "late")
        entries = await _entries(store, key)
        assert _kinds(entries) == [
            "acquired",
            "taken_over",
            "renew_refused",
            "fenced_write_rejected",
        ]
        taken = entries[1]
        assert (taken.owner_id, taken.token) == ("node-b#1", won.fence.token)
        assert taken.detail == f"expired from node-a#1 token {old.token}"
        for entry in entries[2:]:
            assert (entry.owner_id, entry.token) == ("node-a#1", old.token)
        assert entries[2].detail == "not_owner" and entries[3].detail == "newer_owner"

    async def test_the_cap_drops_the_oldest_and_counts_them(self, store: Any) -> None:
        key = key_for("tl-cap")
        fence = await own(store, key, "A")
        extra = 30
        for version in range(1, TIMELINE_CAP + extra):
            assert (await renew(store, fence, version)).ok
        entries, dropped = await store.timeline(key)
        assert len(entries) == TIMELINE_CAP and dropped == extra
        assert entries[0].seq == extra + 1 and entries[-1].seq == TIMELINE_CAP + extra
        assert all(e.kind == "renewed" for e in entries)
        total = TIMELINE_CAP + extra  # one acquire, then the renewals
        later = await _entries(store, key, after_seq=total - 3)
        assert [e.seq for e in later] == [total - 2, total - 1, total]
        assert len(await _entries(store, key, limit=5)) == 5

    async def test_stall_release_cancel_and_a_refused_renewal(self, store: Any) -> None:
        key = key_for("tl-stall")
        fence = await own(store, key, "A")
        assert await store.report_stall(fence, "call_ai", "stuck in the call\ntraceback ...")
        assert await store.release(fence, error="boom\nline two")
        again = await own(store, key, "A")
        assert (await renew(store, again, 0)).ok
        await store.cancel(key, "stopped by hand")
        assert not (await renew(store, again, 1)).ok
        entries = await _entries(store, key)
        assert _kinds(entries) == [
            "acquired",
            "stalled",
            "released",
            "acquired",
            "renewed",
            "cancelled",
            "renew_refused",
        ]
        assert entries[1].detail == "snapshot stored: stuck in the call"
        assert entries[1].stage == "call_ai"
        assert entries[2].detail == "boom" and entries[2].stage == "call_ai"
        assert entries[3].detail == "attempt 2" and entries[3].token == again.token
        assert entries[4].detail == "progress +0"
        assert (entries[5].owner_id, entries[5].token) == ("A", again.token)
        assert entries[5].detail == "stopped by hand" and entries[6].detail == "not_running"

    async def test_a_failure_and_giving_up(self, store: Any) -> None:
        key = key_for("tl-fail")
        fence = await own(store, key, "A")
        await store.fail(fence, "bad\tinput\nmore")
        assert [(e.kind, e.detail) for e in await _entries(store, key)][-1] == (
            "failed",
            "bad input",
        )
        key = key_for("tl-gave-up")
        first = await own(store, key, "A", max_attempts=1)
        assert await store.release(first)
        gone = await store.acquire(key, "A", ttl=30, max_no_progress=30, max_attempts=1)
        assert not isinstance(gone, Acquired)
        last = (await _entries(store, key))[-1]
        assert (last.kind, last.detail) == ("failed", "gave up after 1 attempts")

    async def test_an_unknown_job_has_an_empty_timeline(self, store: Any) -> None:
        assert await store.timeline(key_for("tl-none")) == ([], 0)

    async def test_removing_a_job_removes_its_timeline(self, store: Any) -> None:
        admin = store if isinstance(store, JobAdmin) else None
        assert admin is not None, "the store removes jobs (JobAdmin)"
        removed, pruned = key_for("tl-rm"), key_for("tl-prune")
        for key in (removed, pruned):
            await store.commit(await own(store, key, "A"), "done")
            assert await _entries(store, key)
        assert (await admin.remove(removed)).removed
        await asyncio.sleep(0.05)
        assert await admin.prune(0.01) >= 1
        assert await store.timeline(removed) == ([], 0)
        assert await store.timeline(pruned) == ([], 0)

    async def test_a_note_after_the_lease_was_lost_keeps_the_old_fence(self, store: Any) -> None:
        """``note`` is not fenced: the old owner's ladder steps land after the takeover, with
        the old owner's id, token and stage, by the store's clock, numbered in turn."""
        key = key_for("tl-note")
        old = await own(store, key, "node-a#1", ttl=0.2)
        await asyncio.sleep(0.35)
        won = await store.acquire(key, "node-b#1", ttl=30, max_no_progress=30)
        assert isinstance(won, Acquired)
        notes = _notes(store)
        ids: dict[str, Any] = {"owner_id": "node-a#1", "token": old.token}
        assert await notes.note(key, "terminated", "term: pid 42", stage="call_ai", **ids)
        assert await notes.note(key, "reaped", "kill: pid 42, exit -9", **ids)
        entries = await _entries(store, key)
        assert _kinds(entries) == ["acquired", "taken_over", "terminated", "reaped"]
        assert [e.seq for e in entries] == [1, 2, 3, 4]
        term, reaped = entries[2:]
        assert (term.owner_id, term.token, term.stage) == ("node-a#1", old.token, "call_ai")
        assert term.detail == "term: pid 42" and reaped.detail == "kill: pid 42, exit -9"
        assert reaped.stage == "" and entries[1].at <= term.at <= reaped.at
        assert (await store.get(key)).token == won.fence.token  # the record is untouched

    async def test_a_note_for_an_unknown_job_or_of_an_unknown_kind(self, store: Any) -> None:
        """An unknown key writes nothing and answers False; a kind not in NOTE_KINDS is a
        ValueError, before anything is written."""
        notes, key = _notes(store), key_for("tl-note-none")
        assert not await notes.note(key, "terminated", "x", owner_id="A", token=1)
        assert await store.timeline(key) == ([], 0)
        assert await store.get(key) is None
        known = key_for("tl-note-kind")
        fence = await own(store, known, "A")
        with pytest.raises(ValueError, match="kind 'committed'"):
            await notes.note(known, "committed", "x", owner_id="A", token=fence.token)
        assert _kinds(await _entries(store, known)) == ["acquired"]

    async def test_a_notes_detail_is_clipped_and_flattened(self, store: Any) -> None:
        """Up to NOTE_LIMIT characters of detail (more than an operation's 200), on one line;
        notes count against the cap like every entry."""
        notes, key = _notes(store), key_for("tl-note-long")
        fence = await own(store, key, "A")
        ids: dict[str, Any] = {"owner_id": "A", "token": fence.token}
        assert await notes.note(key, "terminated", "a\tb\nc" + "x" * (2 * NOTE_LIMIT), **ids)
        (entry,) = (await _entries(store, key))[1:]
        assert len(entry.detail) == NOTE_LIMIT and entry.detail.startswith("a b c")
        for _ in range(TIMELINE_CAP - 1):
            assert await notes.note(key, "reaped", "r", **ids)
        entries, dropped = await store.timeline(key)
        assert dropped == 1 and len(entries) == TIMELINE_CAP
        assert entries[0].kind == "terminated" and entries[-1].seq == TIMELINE_CAP + 1
