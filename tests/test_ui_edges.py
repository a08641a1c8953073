"""Dashboard edges: keys that look like routes, actions over a store that refuses writes, and
a timeline row holding text where a token belongs."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from httpx_sse import aconnect_sse

from ai_lease.job import Status
from ai_lease.lease import LeaseStore
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.ui.present import job_url, live_url
from tests.test_ui_app import csrf_of, run_job, serving

ROUTE_LIKE = ("stream", "a/stream", "x/cancel", "live", "jobs/stream")


async def test_keys_that_look_like_routes_open_as_jobs(store: LeaseStore) -> None:
    """A job named `stream`, `a/stream`, `x/cancel`… opens as its own page, and its live
    stream sends its own section."""
    for key in ROUTE_LIKE:
        await run_job(store, key, f"answer of {key}")
    async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
        for key in ROUTE_LIKE:
            page = await client.get(job_url(key))
            assert page.status_code == 200 and f"answer of {key}" in page.text, key
            async with aconnect_sse(client, "GET", live_url(key)) as source:
                event = await anext(source.aiter_sse())
            assert event.event == "job" and f"answer of {key}" in event.data, key


async def test_actions_over_a_read_only_store_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a database file the dashboard's user cannot write (SQLite opened it mode=ro),
    cancel and remove answer a 503 page saying the store refused (nothing done), never a
    500. Root may write any file, so only the permission probe says "not writable"; the
    refusal is SQLite's own."""
    path = tmp_path / "ai-lease.db"
    await _seed(path)
    path.chmod(0o444)
    real_access = os.access

    def access(where: object, mode: int, **kwargs: object) -> bool:
        if mode & os.W_OK and Path(str(where)) == path:
            return False
        return real_access(where, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", access)
    store = SQLiteStore(path)
    try:
        assert await store.get("waiting") is not None  # the first read opens the file
        assert store.read_only  # type: ignore[attr-defined]
        async with serving(store) as base, httpx.AsyncClient(base_url=base) as client:
            csrf = csrf_of((await client.get("/jobs/waiting")).text)
            answers = {
                action: await client.post(
                    f"/jobs/waiting/{action}", data={"csrf": csrf, "force": "1"}
                )
                for action in ("cancel", "remove")
            }
        job = await store.get("waiting")
    finally:
        await store.aclose()
        path.chmod(0o644)
    for action, answer in answers.items():
        assert answer.status_code == 503, (action, answer.status_code, answer.text[:300])
        assert "the store refused the change" in answer.text and "read-only" in answer.text
    assert job is not None and job.status is Status.PENDING


async def _seed(path: Path) -> None:
    store = SQLiteStore(path)
    await store.submit("waiting", "{}", "fp")
    await store.aclose()


async def test_a_text_token_in_a_timeline_row_is_drawn_as_text(
    sqlite_store: LeaseStore, tmp_path: Path
) -> None:
    """A timeline row whose token column holds markup (a planted row) is drawn escaped in
    the SVG: the text shows, no element is made of it."""
    await run_job(sqlite_store, "planted")
    where = sqlite_store.where  # type: ignore[attr-defined]
    with sqlite3.connect(where.removeprefix("sqlite:///")) as conn:
        conn.execute(
            "UPDATE ai_lease_timeline SET token = ? WHERE key = ?",
            ('<tspan id="evil">x</tspan>', "planted"),
        )
    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        page = await client.get("/jobs/planted")
    assert page.status_code == 200
    assert '<tspan id="evil">' not in page.text and "&lt;tspan id=&#34;evil&#34;&gt;" in page.text
    job = await sqlite_store.get("planted")
    assert job is not None and job.status is Status.DONE


def _offered(page: str) -> set[str]:
    """The action buttons of a job page not marked hidden."""
    forms = re.findall(r'<form class="action"[^>]*>.*?</form>', page, re.S)
    return {
        re.search(r'<button type="submit" id="(\w+)"', form).group(1)  # type: ignore[union-attr]
        for form in forms
        if not re.search(r"<form[^>]* hidden>", form)
    }


async def test_actions_are_offered_only_where_they_can_work(sqlite_store: LeaseStore) -> None:
    """A DONE job offers Remove only; a FAILED one Retry and Remove; a PENDING one Cancel
    and Remove; the favicon is served."""
    await run_job(sqlite_store, "finished")
    await sqlite_store.submit("waiting", "{}", "fp")  # type: ignore[attr-defined]
    await sqlite_store.submit("gone-wrong", "{}", "fp")  # type: ignore[attr-defined]
    await sqlite_store.cancel("gone-wrong", "test")
    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        offered = {
            key: _offered((await client.get(job_url(key))).text)
            for key in ("finished", "waiting", "gone-wrong")
        }
        icon = await client.get("/static/favicon.svg")
    assert offered == {
        "finished": {"remove"},
        "waiting": {"cancel", "remove"},
        "gone-wrong": {"retry", "remove"},
    }
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg")


async def test_a_finished_jobs_timeline_marks_where_its_lapsed_lease_expired(
    store: LeaseStore,
) -> None:
    """A DONE job taken over after its first owner's lease lapsed: with the configured lease
    length the dashboard marks the expiry on the lapsed lane (the record no longer shows a
    lease); without it, only the takeover's line."""
    from ai_lease.lease.base import Acquired

    await store.acquire("lapsed-then-done", "owner-a", ttl=0.5, max_no_progress=5)
    # real: the lease lapses on the store's own clock
    await asyncio.sleep(1.2)  # the lease lapses (store clock)
    second = await store.acquire("lapsed-then-done", "owner-b", ttl=30, max_no_progress=5)
    assert isinstance(second, Acquired) and second.takeover
    await store.commit(second.fence, '"done"')
    for ttl, marked in ((0.5, True), (None, False)):
        async with serving(store, lease_ttl=ttl) as base, httpx.AsyncClient(base_url=base) as c:
            page = (await c.get(job_url("lapsed-then-done"))).text
        assert ('class="lease-expired"' in page) is marked, ttl
        assert 'class="lease-expiry"' in page
