"""The job-listing contract: a store that lists pages of jobs (:class:`JobListing`) passes it.

Pages come newest first, their cursors cover every job exactly once while jobs are added,
filters by status and by a literal key prefix, and the counts move with each job's status.
Use it like :class:`~ai_lease.testing.contract.LeaseStoreContract` (a ``store`` fixture,
a fresh store per test for the counts); override :meth:`ListingContract.corrupt` to spoil
a record in a store of your own.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
from typing import Any

import pytest

from ai_lease.errors import CorruptRecord
from ai_lease.job import JobState
from ai_lease.lease.base import JobListing, JobPage
from ai_lease.testing.contract_support import key_for, own

__all__ = ["ListingContract"]


async def _all_pages(store: Any, limit: int, **filters: Any) -> list[JobState]:
    """Every job, page by page (at most 1000 pages: a cursor that never ends fails)."""
    jobs: list[JobState] = []
    after = None
    for _ in range(1000):
        page = await store.list_page(after=after, limit=limit, **filters)
        assert isinstance(page, JobPage) and len(page.jobs) <= limit
        jobs += page.jobs
        if (after := page.next_cursor) is None:
            return jobs
    raise AssertionError("the pages never ended")


def _keys(jobs: list[JobState]) -> list[str]:
    return [job.key for job in jobs]


async def _submit(store: Any, keys: list[str]) -> None:
    for key in keys:
        await store.submit(key, "{}", "fp")


class ListingContract:
    """What every store that lists jobs for a dashboard promises."""

    async def corrupt(self, store: Any, key: str) -> None:
        """Make job ``key``'s stored record one that is not ours (the built-in stores)."""
        if hasattr(store, "path"):  # SQLite: the row's record is no longer JSON
            conn = sqlite3.connect(store.path)
            conn.execute("UPDATE ai_lease_jobs SET record = ? WHERE key = ?", (b"{not", key))
            conn.commit()
            conn.close()
        elif hasattr(store, "_client"):  # Redis: the hash's schema marker is foreign
            await store._client.hset(store.keys(key)[0], "schema", "2")
        elif hasattr(store, "_fetch") and hasattr(store, "schema"):  # PostgreSQL: a status
            # no ai_lease writes (the row no longer decodes)
            await store._fetch(
                "corrupt",
                "UPDATE {schema}.ail_jobs SET status = 'BOGUS' WHERE key = %s RETURNING key",
                (key,),
            )
        else:
            pytest.skip("override ListingContract.corrupt to spoil a record of this store")

    async def test_pages_are_newest_first(self, store: Any) -> None:
        """A page lists jobs by creation time, the newest first, each job once."""
        assert isinstance(store, JobListing)
        keys = [key_for(f"newest-{n}") for n in range(6)]
        await _submit(store, keys)
        page = await store.list_page()
        assert _keys(page.jobs) == keys[::-1] and page.next_cursor is None
        times = [job.created_at for job in page.jobs]
        assert times == sorted(times, reverse=True)

    async def test_pages_cover_every_job_once_while_jobs_are_added(self, store: Any) -> None:
        """Following the cursors visits each job that was there exactly once, though new
        jobs arrive between pages (they are newer: before the cursor, not on later pages)."""
        keys = [key_for(f"cover-{n}") for n in range(23)]
        await _submit(store, keys)
        seen: list[str] = []
        page = await store.list_page(limit=5)
        while True:
            seen += _keys(page.jobs)
            await _submit(store, [key_for("cover-late")])
            if page.next_cursor is None:
                break
            page = await store.list_page(limit=5, after=page.next_cursor)
        assert seen == keys[::-1]

    async def test_status_filter(self, store: Any) -> None:
        """``status`` lists only that status's jobs, across pages, newest first; an empty one
        lists all, an unknown one is a ValueError."""
        pending = [key_for(f"st-pending-{n}") for n in range(4)]
        await _submit(store, pending)
        running = [key_for(f"st-running-{n}") for n in range(5)]
        for key in running:
            await own(store, key)
        await store.commit(await own(store, done := key_for("st-done")), "r")
        assert _keys(await _all_pages(store, 2, status="RUNNING")) == running[::-1]
        assert _keys(await _all_pages(store, 3, status="PENDING")) == pending[::-1]
        assert _keys(await _all_pages(store, 50, status="DONE")) == [done]
        assert (await store.list_page(status="CANCELLED")).jobs == []
        assert len((await store.list_page(status="")).jobs) == 10
        for bad in ("running", "BOGUS", "' OR 1=1 --"):
            with pytest.raises(ValueError, match="status must be one of"):
                await store.list_page(status=bad)

    async def test_prefix_filter_is_literal(self, store: Any) -> None:
        """A prefix matches keys starting with it character for character: ``%``, ``_``,
        ``*``, ``[``, ``{`` and ``}`` are no wildcards, and a prefix can be combined with a
        status."""
        base = key_for("px")
        tails = ["%a", "%%", "_a", "xa", "*a", "?a", "[a]", "ba", "{a}", "}a", "%7Ba", "\\a"]
        await _submit(store, [base + tail for tail in tails])
        await _submit(store, [base])
        for want in ("%", "_", "*", "[", "{", "}", "%7B", "\\", "?"):
            listed = _keys(await _all_pages(store, 2, prefix=base + want))
            expected = [base + t for t in tails if t.startswith(want)][::-1]
            assert listed == expected, want
        assert len(await _all_pages(store, 50, prefix=base)) == len(tails) + 1
        assert (await store.list_page(prefix=base + "%", status="RUNNING")).jobs == []
        assert (await store.list_page(prefix=base + "nothing")).jobs == []

    async def test_limit_is_bounded(self, store: Any) -> None:
        """``limit`` is a whole number from 1 to 500 (else ValueError); a page holds at most
        that many jobs and says whether more follow."""
        await _submit(store, [key_for(f"limit-{n}") for n in range(4)])
        for bad in (0, -1, 501, True, 2.5, "3"):
            with pytest.raises(ValueError, match="limit"):
                await store.list_page(limit=bad)
        first = await store.list_page(limit=3)
        assert len(first.jobs) == 3 and first.next_cursor is not None
        rest = await store.list_page(limit=500, after=first.next_cursor)
        assert len(rest.jobs) == 1 and rest.next_cursor is None

    async def test_a_cursor_not_given_by_a_page_is_a_value_error(self, store: Any) -> None:
        """Garbage, forged or injected cursors are a ValueError naming the cursor, never a
        crash; a well-formed cursor holding SQL text is just a position."""
        await _submit(store, [key := key_for("cursor")])

        def b64(text: str) -> str:
            return base64.urlsafe_b64encode(text.encode()).decode()

        forged = ["", "garbage!", "%%%", b64("no-colon"), b64("12:"), b64("x1:key")]
        forged += [b64("-5:key"), b64("1' OR 1=1 --"), "A" * 70_000, b64(f"{10**20}:k")]
        for cursor in forged:
            with pytest.raises(ValueError, match="cursor"):
                await store.list_page(after=cursor)
        injected = b64("9000000000000000:' OR 1=1; DROP TABLE ai_lease_jobs; --")
        assert _keys((await store.list_page(after=injected)).jobs) == [key]
        assert (await store.list_page(after=b64("1:a"))).jobs == []
        assert await store.get(key) is not None

    async def test_a_corrupt_record_is_skipped_and_reported(self, store: Any) -> None:
        """A record that is not ours is left out of its page and reported to ``on_corrupt``
        (without one, the page still comes back); the jobs around it are listed."""
        keys = [key_for(f"corrupt-{n}") for n in range(5)]
        await _submit(store, keys)
        await self.corrupt(store, keys[2])
        reported: list[CorruptRecord] = []
        jobs = await _all_pages(store, 2, on_corrupt=reported.append)
        assert _keys(jobs) == [keys[4], keys[3], keys[1], keys[0]]
        assert [exc.key for exc in reported] == [keys[2]]
        assert len((await store.list_page()).jobs) == 4

    async def test_removed_and_pruned_jobs_leave_the_listing(self, store: Any) -> None:
        """A removed job and pruned ones are gone from the pages and from the counts."""
        keys = [key_for(f"gone-{n}") for n in range(4)]
        await _submit(store, keys[:2])
        for key in keys[2:]:
            await store.commit(await own(store, key), "r")
        assert (await store.remove(keys[0])).removed
        await asyncio.sleep(0.05)
        assert await store.prune(0.0) == 2
        assert _keys(await _all_pages(store, 2)) == [keys[1]]
        assert await store.count_jobs() == {"PENDING": 1}

    async def test_counts_follow_each_status(self, store: Any) -> None:
        """count_jobs gives jobs per status (none: left out), moving as jobs start, end,
        are cancelled, retried and removed."""
        assert await store.count_jobs() == {}
        await _submit(store, [key_for(f"count-{n}") for n in range(3)])
        fence = await own(store, running := key_for("count-run"))
        await own(store, cancelled := key_for("count-cancel"))
        await store.cancel(cancelled)
        assert await store.count_jobs() == {"PENDING": 3, "RUNNING": 1, "CANCELLED": 1}
        await store.commit(fence, "r")
        await store.retry(cancelled)
        assert await store.count_jobs() == {"PENDING": 4, "DONE": 1}
        await store.remove(running)
        assert await store.count_jobs() == {"PENDING": 4}

    async def test_a_retried_job_is_listed_as_new(self, store: Any) -> None:
        """retry starts a job's clock again (``created_at`` now): it comes first, once."""
        keys = [key_for(f"again-{n}") for n in range(3)]
        await own(store, keys[0])
        await store.cancel(keys[0])
        await _submit(store, keys[1:])
        await store.retry(keys[0])
        assert _keys(await _all_pages(store, 1)) == [keys[0], keys[2], keys[1]]
