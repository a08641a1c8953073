"""The dashboard's pages: jobs, one job, workers, login, and the errors they answer with.

Each handler reads the store once or twice (a page of jobs and the counts; a job and its
timeline) and renders one template. ``Ui`` is what they share (``request.app.state.ui``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, urlencode

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from ai_lease.client import Client
from ai_lease.errors import CorruptRecord, JobSpecError
from ai_lease.job import JobState, Status, validate_key
from ai_lease.lease.base import JobListing
from ai_lease.lease.queue import JobQueue
from ai_lease.lease.rules import RETRYABLE
from ai_lease.lease.storable import key_can_start
from ai_lease.lease.timeline import JobTimeline, TimelineEntry
from ai_lease.observe.phi import DEFAULT_THRESHOLD
from ai_lease.ui.auth import COOKIE, Guard, Session
from ai_lease.ui.charts import bar_chart
from ai_lease.ui.listing import HEALTHS, STATUSES, Filters, Workers, read_page, read_workers
from ai_lease.ui.overview import RECENT_READ, RUNNING_READ, Overview, read_overview
from ai_lease.ui.present import (
    attention_row,
    corrupt_row,
    job_row,
    job_url,
    live_url,
    worker_row,
)
from ai_lease.ui.render import Templates, job_context
from ai_lease.ui.shared_reads import MAX_STREAMS, SharedReads, StreamSlots

__all__ = [
    "FLASHES",
    "OVERVIEW_EVERY_S",
    "Ui",
    "bad_request",
    "form_fields",
    "overview_of",
    "page",
    "url_problem",
]

MAX_FORM_BYTES = 16_384
OVERVIEW_EVERY_S = 2.0
"""The jobs page's summary (five bounded reads) is read at most this often, shared by every
page and live stream that shows it."""


@dataclass
class Ui:
    """What every handler shares: the client, the guard, the templates, the refresh."""

    client: Client
    guard: Guard
    refresh: float
    settings_view: Mapping[str, str] = field(default_factory=dict)
    templates: Templates = field(default_factory=Templates)
    phi_threshold: float = DEFAULT_THRESHOLD  # lease.phi_threshold: when φ says "suspect"
    lease_ttl: float | None = None  # lease.ttl: where a lapsed lease expired, on any timeline
    reads: SharedReads = field(default_factory=SharedReads)  # one read per view per refresh
    streams: StreamSlots = field(default_factory=lambda: StreamSlots(MAX_STREAMS))


def ui_of(request: Request) -> Ui:
    ui: Ui = request.app.state.ui
    return ui


def session_of(request: Request) -> Session | None:
    return ui_of(request).guard.session(request.cookies.get(COOKIE))


def set_session_cookie(response: Response, value: str) -> None:
    response.set_cookie(COOKIE, value, httponly=True, samesite="strict", path="/")


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """``template`` as an HTML response, with a session (and its CSRF token) for forms."""
    ui = ui_of(request)
    session, cookie = session_of(request), None
    if session is None:
        session, cookie = ui.guard.new_cookie(authenticated=False)
    context.setdefault("stream", None)
    context.setdefault("flash", flash_of(request))
    # Nothing about the store before login: the login page and the 401 page show no URL.
    known = (
        not ui.guard.required
        or session.authenticated
        or ui.guard.bearer_ok(request.headers.get("authorization"))
    )
    html = ui.templates.render(
        template,
        where=ui.settings_view.get("store", "") if known else "",
        csrf=ui.guard.csrf_token(session),
        **context,
    )
    response = HTMLResponse(html, status_code=status_code)
    if cookie is not None:
        set_session_cookie(response, cookie)
    return response


# Which statuses each of a job page's actions can work in (the others are not offered).
ACTIONS = (
    ("cancel", tuple(s.value for s in Status if not s.terminal)),
    ("retry", tuple(s.value for s in Status if s in RETRYABLE)),
    ("remove", tuple(s.value for s in Status)),
)

# A flash is a code in the redirect's query (never free text from the request).
FLASHES = {
    "cancelled": ("info", "Cancelled: its owner stops within one renew interval."),
    "not-cancelled": ("error", "Not cancelled: the job had already ended (nothing changed)."),
    "retried": ("info", "Retried: PENDING, due for workers."),
    "not-retried": ("error", "Only a FAILED or CANCELLED job can be retried (nothing changed)."),
    "removed": ("info", "Removed."),
    "kept": ("error", "RUNNING under a live lease: tick force to cancel and remove it."),
    "unknown": ("error", "No such job."),
    "no-admin": ("error", "This store cannot retry or remove jobs."),
}


def flash_of(request: Request) -> dict[str, str] | None:
    code = request.query_params.get("flash", "")
    if code not in FLASHES:
        return None
    level, text = FLASHES[code]
    key = request.query_params.get("key")
    return {"level": level, "text": f"{key}: {text}" if key else text}


async def form_fields(request: Request) -> dict[str, str]:
    """An urlencoded form's fields (first value of each), bounded in size."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return {}
    parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in parsed.items()}


def not_found(request: Request, message: str) -> Response:
    return page(request, "error.html", 404, title="Not found", message=message, login=False)


def bad_request(request: Request, message: str) -> Response:
    return page(request, "error.html", 400, title="Bad request", message=message, login=False)


def url_problem(request: Request) -> str | None:
    """What makes the URL's job key or key prefix one no job can have (a NUL, a control
    character, over 512 characters), said for the page; None when both are fine. Checked
    before any store read: a store may refuse such text outright (PostgreSQL's text holds
    no NUL), and no job could match it anyway."""
    key = request.path_params.get("key")
    if key is not None:
        try:
            validate_key(key)
        except JobSpecError as exc:
            return f"{exc}: no job can have this key, so there is none to show."
    prefix = request.query_params.get("prefix") or ""
    if prefix and not key_can_start(prefix):
        return (
            f"The key prefix {prefix[:40]!r} holds a control character (or is over 512 "
            "characters): no job key starts with it. Filter by printable text."
        )
    return None


def corrupt_page(request: Request, bad: CorruptRecord) -> Response:
    """500 with what is stored wrong, under which key, and that it was left as it is."""
    message = f"{bad}. The other jobs are served as usual."
    return page(request, "error.html", 500, title="Corrupt record", message=message, login=False)


# -- the pages ---------------------------------------------------------------------------


async def home(request: Request) -> Response:
    return RedirectResponse("/jobs", status_code=307)


def _overview_context(found: Overview) -> dict[str, Any]:
    charts = {
        "queued": bar_chart("chart-queued", "queue depth per minute", found.queued, "#1565c0"),
        "done": bar_chart("chart-done", "jobs done per minute", found.done, "#2e7d32"),
        "failed": bar_chart("chart-failed", "jobs failed per minute", found.failed, "#c62828"),
    }
    return {
        "overview": found,
        "charts": charts,
        "attention": [attention_row(job) for job in found.attention],
        "running_read": RUNNING_READ,
        "recent_read": RECENT_READ,
    }


async def overview_of(ui: Ui, filters: Filters) -> tuple[object, Markup | None]:
    """The summary the unfiltered first page leads with, as (state, HTML); (None, None) for
    a filtered view or a later page. One read per :data:`OVERVIEW_EVERY_S` at most."""
    if filters.query():
        return None, None

    async def read() -> tuple[object, Any]:
        found = await read_overview(ui.client)
        unread = [replace(job, read_at=0.0) for job in found.attention]
        state = (found.statuses, found.healths, unread, found.queued, found.done, found.failed)
        return state, lambda: ui.templates.render("_overview.html", **_overview_context(found))

    max_age = max(ui.refresh * 0.9, OVERVIEW_EVERY_S)
    state, html = await ui.reads.get(("overview",), read, max_age=max_age)
    return state, Markup(html)  # rendered by our autoescaping templates


async def jobs(request: Request) -> Response:
    """The jobs table: one page, newest first, filtered (unfiltered, led by the summary);
    live over ``/live/jobs``."""
    ui, filters = ui_of(request), Filters.from_query(request.query_params)
    listing = await read_page(ui.client, filters)
    _, overview = await overview_of(ui, filters)
    counts: list[tuple[str, int]] = []
    if overview is None and ui.client.serves(JobListing):
        found = await ui.client.counts()
        counts = [(s, found.get(s, 0)) for s in STATUSES]
    query = urlencode(filters.query(after=filters.after))
    next_url = None
    if listing.next_cursor is not None:
        next_url = "/jobs?" + urlencode(filters.query(after=listing.next_cursor))
    return page(
        request,
        "jobs.html",
        rows=[job_row(job) for job in listing.jobs],
        corrupt=[corrupt_row(bad) for bad in listing.corrupt],
        filters=filters,
        filtered=bool(filters.query()),
        statuses=STATUSES,
        healths=HEALTHS,
        counts=counts,
        overview=overview,
        next_url=next_url,
        first_url=("/jobs?" + urlencode(filters.query())) if filters.after else None,
        stream="/live/jobs" + (f"?{query}" if query else ""),
        target="jobs-body",
    )


async def read_job(client: Client, key: str) -> tuple[JobState | None, list[TimelineEntry], int]:
    """A job's record and its timeline (none when the store keeps none); a key that cannot
    name a job has none."""
    try:
        job = await client.status(key)
    except JobSpecError:
        return None, [], 0
    if job is None or not client.serves(JobTimeline):
        return job, [], 0
    entries, dropped = await client.events(key)
    return job, entries, dropped


async def job(request: Request) -> Response:
    """One job: record, stall snapshot, result, timeline, actions; live over its stream."""
    key = request.path_params["key"]
    try:
        found, entries, dropped = await read_job(ui_of(request).client, key)
    except CorruptRecord as exc:
        return corrupt_page(request, exc)
    if found is None:
        return not_found(request, f"There is no job {key!r} in this store.")
    return page(
        request,
        "job.html",
        key=key,
        url=job_url(key),
        stream=live_url(key),
        target="job-live",
        actions=ACTIONS,
        **job_context(
            found, entries, dropped, ui_of(request).phi_threshold, ui_of(request).lease_ttl
        ),
    )


async def workers(request: Request) -> Response:
    """Live workers: host, pid, the jobs they still run with each one's health (each
    re-read: one that ended since the worker's last beat is left out), what each finished
    lately, last seen by the store's clock; a corrupt entry as its own row. Live over
    ``/live/workers``."""
    return page(
        request,
        "workers.html",
        stream="/live/workers",
        target="workers-body",
        **await workers_context(ui_of(request).client),
    )


async def workers_context(client: Client) -> dict[str, Any]:
    """What ``_workers.html`` shows: the workers' rows (their running jobs' health, their
    jobs finished in the last ten minutes among the newest :data:`RECENT_READ` done and
    failed records) and the corrupt entries."""
    listing = await read_workers(client) if client.serves(JobQueue) else None
    if listing is None:
        listing = Workers([], [], time.time())
    finished: list[JobState] = []
    if listing.found:
        for status in (Status.DONE, Status.FAILED):
            finished += (await read_page(client, Filters(status=status.value), RECENT_READ)).jobs
    now = listing.read_at
    return {
        "workers": [worker_row(w, now, listing.records, finished) for w in listing.found],
        "corrupt": [corrupt_row(bad) for bad in listing.corrupt],
    }


async def login_form(request: Request) -> Response:
    if not ui_of(request).guard.required:
        return RedirectResponse("/jobs", status_code=303)
    return page(request, "login.html")


async def login(request: Request) -> Response:
    """Check the token; set an authenticated session cookie and go to the jobs."""
    guard = ui_of(request).guard
    if not guard.required:
        return RedirectResponse("/jobs", status_code=303)
    client = request.client.host if request.client else "unknown"
    wait_s = guard.throttle.wait_s(client)
    if wait_s > 0:  # not even looked at: guessing is slowed per client
        text = f"Too many wrong tokens from here: try again in {math.ceil(wait_s)} s."
        response = page(request, "login.html", 429, flash={"level": "error", "text": text})
        response.headers["Retry-After"] = str(math.ceil(wait_s))
        return response
    fields = await form_fields(request)
    if not guard.token_ok(fields.get("token")):
        guard.throttle.failed(client)
        flash = {"level": "error", "text": "That is not the token."}
        return page(request, "login.html", 401, flash=flash)
    guard.throttle.succeeded(client)
    _, cookie = guard.new_cookie(authenticated=True)
    response = RedirectResponse("/jobs", status_code=303)
    set_session_cookie(response, cookie)
    return response
