"""Live pages over Server-Sent Events: the jobs table's rows, one job's live section.

Each open page has its own stream, which reads the store once per refresh interval and
sends the rendered HTML (escaped by the templates) only when it differs from what it last
sent. A job's stream reads the record each interval and its timeline only when the record
changed, so an idle page costs one small read per interval however many jobs there are.
A store that does not answer costs that interval's update, never the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from ai_lease.errors import AiLeaseError
from ai_lease.lease.base import JobTimeline, TimelineEntry
from ai_lease.ui.listing import Filters, read_page
from ai_lease.ui.present import job_row
from ai_lease.ui.render import job_context
from ai_lease.ui.views import Ui, ui_of

__all__ = ["job_stream", "jobs_stream"]

log = logging.getLogger("ai_lease.ui")


async def _changes(
    request: Request, ui: Ui, event: str, produce: Any
) -> AsyncIterator[dict[str, str]]:
    """``produce()``'s HTML as ``event`` events, once per interval, when it changed."""
    last: str | None = None
    while not await request.is_disconnected():
        try:
            html = await produce()
        except (AiLeaseError, OSError) as exc:  # the next interval tries again
            log.debug("ui: live update skipped: %r", exc)
            html = last
        if html is not None and html != last:
            last = html
            yield {"event": event, "data": html}
        await asyncio.sleep(ui.refresh)


async def jobs_stream(request: Request) -> Response:
    """``rows`` events: the jobs table body for the page's filters."""
    ui, filters = ui_of(request), Filters.from_query(request.query_params)

    async def rows() -> str:
        listing = await read_page(ui.store, filters)
        context = {
            "rows": [job_row(job) for job in listing.jobs],
            "filtered": bool(filters.query()),
        }
        return ui.templates.render("_rows.html", **context)

    return EventSourceResponse(_changes(request, ui, "rows", rows), ping=15)


async def job_stream(request: Request) -> Response:
    """``job`` events: one job's live section (record, timeline, snapshot, result)."""
    ui, key = ui_of(request), request.path_params["key"]
    seen: dict[str, Any] = {"mark": None, "entries": [], "dropped": 0}

    async def live() -> str | None:
        job = await ui.store.get(key)
        if job is None:
            return '<p class="note">This job is gone (removed).</p>'
        mark = (job.updated_at, job.status, job.token, job.progress_version)
        if mark != seen["mark"] and isinstance(ui.store, JobTimeline):
            entries: list[TimelineEntry]
            entries, seen["dropped"] = await ui.store.timeline(key)
            seen["entries"], seen["mark"] = entries, mark
        html: str = ui.templates.render(
            "_job_live.html", **job_context(job, seen["entries"], seen["dropped"])
        )
        return html

    return EventSourceResponse(_changes(request, ui, "job", live), ping=15)
