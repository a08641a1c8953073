"""Live pages over Server-Sent Events: the jobs table's rows, one job's live section.

Each open page has its own stream, which asks for its view once per refresh interval and
sends the rendered HTML (escaped by the templates) only when it differs from what it last
sent. Pages showing the same view share one store read per interval
(:class:`~ai_lease.ui.shared_reads.SharedReads`), and at most ``max_streams`` streams are
open at once (past that, 503). A job's stream reads the record each interval and its
timeline only when the record changed, so an idle page costs one small read per interval
however many jobs there are. A store that does not answer costs that interval's update,
never the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import replace
from typing import Any

from markupsafe import escape
from sse_starlette.sse import EventSourceResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ai_lease.errors import AiLeaseError, CorruptRecord, JobSpecError
from ai_lease.job import JobState
from ai_lease.lease.timeline import JobTimeline
from ai_lease.ui.listing import Filters, read_page
from ai_lease.ui.present import corrupt_row, job_row
from ai_lease.ui.render import job_context
from ai_lease.ui.views import Ui, overview_of, ui_of, workers_context

__all__ = ["job_stream", "jobs_stream", "workers_stream"]

log = logging.getLogger("ai_lease.ui")


Produce = Callable[[], Awaitable[tuple[object, Callable[[], str]]]]
"""One store read: the state it found (compared, never shown) and how to render it."""


def _unread(job: JobState) -> JobState:
    """The record without its read time: what changed is the job, not the clock."""
    return replace(job, read_at=0.0)


async def _changes(
    request: Request, ui: Ui, event: str, view: Hashable, produce: Produce
) -> AsyncIterator[dict[str, str]]:
    """``event`` events, one shared store read per interval, sent when the state changed.

    Relative times ("3 s ago") grow between sends on the page itself (``ui.js``), so a
    table of finished jobs sends nothing at all."""
    last: object = _NOTHING
    opened = ui.reads.now()  # a read begun before this may be older than the page itself
    while not await request.is_disconnected():
        try:
            state, html = await ui.reads.get(
                view, produce, max_age=ui.refresh * 0.9, newer_than=opened
            )
        except (AiLeaseError, OSError) as exc:  # the next interval tries again
            log.debug("ui: live update skipped: %r", exc)
        else:
            if state != last:
                last = state
                yield {"event": event, "data": html}
        await asyncio.sleep(ui.refresh)


_NOTHING = object()


def _stream(request: Request, ui: Ui, events: AsyncIterator[dict[str, str]]) -> Response:
    """The events as an SSE response holding one of the ``max_streams`` slots, or a 503."""
    if not ui.streams.take():
        text = (
            f"503: {ui.streams.cap} live pages are open on this dashboard already; "
            "close some (this page still works: reload it)"
        )
        return PlainTextResponse(text, status_code=503, headers={"Retry-After": "5"})

    released = False

    def give_back() -> None:  # once: when the stream ends, or after a response never streamed
        nonlocal released
        if not released:
            released = True
            ui.streams.give_back()

    async def holding() -> AsyncIterator[dict[str, str]]:
        try:
            async for message in events:
                yield message
        finally:
            give_back()

    return EventSourceResponse(holding(), ping=15, background=BackgroundTask(give_back))


async def jobs_stream(request: Request) -> Response:
    """``rows`` events: the jobs table (led by the summary on the unfiltered first page)
    for the page's filters."""
    ui, filters = ui_of(request), Filters.from_query(request.query_params)

    async def rows() -> tuple[object, Callable[[], str]]:
        listing = await read_page(ui.client, filters)
        summary, overview = await overview_of(ui, filters)
        corrupt = [corrupt_row(bad) for bad in listing.corrupt]
        context = {
            "rows": [job_row(job) for job in listing.jobs],
            "corrupt": corrupt,
            "filtered": bool(filters.query()),
            "overview": overview,
        }
        state = ([_unread(job) for job in listing.jobs], corrupt, summary)
        return state, lambda: ui.templates.render("_jobs_live.html", **context)

    view = ("rows", filters)  # frozen: every field, the page cursor too, tells views apart
    return _stream(request, ui, _changes(request, ui, "rows", view, rows))


async def job_stream(request: Request) -> Response:
    """``job`` events: one job's live section (record, timeline, snapshot, result)."""
    ui, key = ui_of(request), request.path_params["key"]
    seen: dict[str, Any] = {"mark": None, "entries": [], "dropped": 0}

    async def live() -> tuple[object, Callable[[], str]]:
        try:
            job = await ui.client.status(key)
        except JobSpecError:  # a key no job can have: gone, like any key not there
            job = None
        except CorruptRecord as exc:
            note = f'<p class="note">{escape(str(exc))}</p>'
            return str(exc), lambda: note
        if job is None:
            return None, lambda: '<p class="note">This job is gone (removed).</p>'
        mark = (job.updated_at, job.status, job.token, job.progress_version)
        if mark != seen["mark"] and ui.client.serves(JobTimeline):
            seen["entries"], seen["dropped"] = await ui.client.events(key)
            seen["mark"] = mark
        entries, dropped = seen["entries"], seen["dropped"]
        context = job_context(job, entries, dropped, ui.phi_threshold, ui.lease_ttl)
        state = (_unread(job), len(entries), dropped)
        return state, lambda: ui.templates.render("_job_live.html", **context)

    return _stream(request, ui, _changes(request, ui, "job", ("job", key), live))


async def workers_stream(request: Request) -> Response:
    """``workers`` events: the workers table body (their running jobs' health, throughput)."""
    ui = ui_of(request)

    async def rows() -> tuple[object, Callable[[], str]]:
        context = await workers_context(ui.client)
        seen = [replace(w, last_seen="", last_seen_s=0.0) for w in context["workers"]]
        state = (seen, context["corrupt"])
        return state, lambda: ui.templates.render("_workers.html", **context)

    return _stream(request, ui, _changes(request, ui, "workers", ("workers",), rows))
