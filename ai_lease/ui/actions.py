"""The job page's buttons: cancel, retry, remove — the same :class:`~ai_lease.client.Client`
methods as the CLI and a script.

POST only, each with the page's CSRF token (403 without it); each redirects back with a
flash code. The rules are the store's and the CLI's: ``cancel`` ends a PENDING or RUNNING
job (its owner stops within one renew interval), ``retry`` reopens a FAILED or CANCELLED
one, ``remove`` keeps a RUNNING job under a live lease unless ``force`` (then cancels first,
as ``ai-lease rm --force``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ai_lease.client import Client
from ai_lease.errors import JobSpecError, StoreError
from ai_lease.job import Status, validate_key
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.rules import RETRYABLE
from ai_lease.redaction import redact
from ai_lease.ui.present import job_url
from ai_lease.ui.views import form_fields, page, session_of, ui_of

__all__ = ["cancel", "remove", "retry"]

CANCEL_REASON = "cancelled from ai-lease ui"
REMOVE_REASON = "removed from ai-lease ui (force)"


async def _checked(request: Request) -> dict[str, str] | None:
    """The form's fields when its CSRF token is this session's, else None."""
    fields = await form_fields(request)
    if not ui_of(request).guard.csrf_ok(session_of(request), fields.get("csrf")):
        return None
    return fields


def _client(request: Request) -> Client | None:
    """A client on the dashboard's store for the page's job, or None when its key cannot
    name a job (no job has it: the page says unknown, as for any key not there)."""
    try:
        validate_key(request.path_params["key"])
    except JobSpecError:
        return None
    return ui_of(request).client


def _forbidden() -> Response:
    return PlainTextResponse(
        "403: this form's CSRF token is missing or stale: reload the page and try again",
        status_code=403,
    )


def _back(key: str, code: str, *, to_list: bool = False) -> Response:
    where = "/jobs" if to_list else job_url(key)
    return RedirectResponse(f"{where}?{urlencode({'flash': code, 'key': key})}", status_code=303)


Action = Callable[[Request], Awaitable[Response]]


def _store_may_refuse(action: Action) -> Action:
    """A store that refuses the change (a read-only file, an outage) is a page saying so
    (503) — nothing was done — never a 500."""

    @functools.wraps(action)
    async def act(request: Request) -> Response:
        try:
            return await action(request)
        except StoreError as exc:
            key = request.path_params["key"]
            message = f"Nothing was done to {key!r}: the store refused the change: {exc}"
            return page(
                request, "error.html", 503, title="Not done", message=redact(message), login=False
            )

    return act


@_store_may_refuse
async def cancel(request: Request) -> Response:
    """Cancel the job (``ai-lease cancel``)."""
    if await _checked(request) is None:
        return _forbidden()
    key, client = request.path_params["key"], _client(request)
    job = None if client is None else await client.cancel(key, CANCEL_REASON)
    if job is None:
        return _back(key, "unknown", to_list=True)
    return _back(key, "cancelled" if job.status is Status.CANCELLED else "not-cancelled")


@_store_may_refuse
async def retry(request: Request) -> Response:
    """Send a FAILED or CANCELLED job back to PENDING (``ai-lease retry``)."""
    if await _checked(request) is None:
        return _forbidden()
    key, client = request.path_params["key"], _client(request)
    if not ui_of(request).client.serves(JobAdmin):
        return _back(key, "no-admin")
    before = None if client is None else await client.status(key)
    if client is None or before is None:
        return _back(key, "unknown", to_list=True)
    if before.status not in RETRYABLE:
        return _back(key, "not-retried")
    after = await client.retry(key)  # atomic: a job changed meanwhile is kept
    retried = after is not None and after.status is Status.PENDING
    return _back(key, "retried" if retried else "not-retried")


@_store_may_refuse
async def remove(request: Request) -> Response:
    """Remove the job's record (``ai-lease rm``; ``force`` cancels a running one first)."""
    fields = await _checked(request)
    if fields is None:
        return _forbidden()
    key, client = request.path_params["key"], _client(request)
    force = fields.get("force") in ("1", "on", "true")
    if not ui_of(request).client.serves(JobAdmin):
        return _back(key, "no-admin")
    if client is None:
        return _back(key, "unknown", to_list=True)
    removal = await client.remove(key, force=force, reason=REMOVE_REASON)
    if removal.job is None:
        return _back(key, "unknown", to_list=True)
    if not removal.removed:
        return _back(key, "kept")
    return _back(key, "removed", to_list=True)
