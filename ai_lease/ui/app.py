"""The dashboard as an ASGI app: routes, the token guard, security headers, metrics.

>>> app = create_app(Client(store), token="s3cret")        # doctest: +SKIP
>>> uvicorn.run(app, host="127.0.0.1", port=8377)  # doctest: +SKIP

Routes: ``/`` (to ``/jobs``), ``/jobs``, ``/jobs/{key}``, their live streams
``/live/jobs`` and ``/live/jobs/{key}``, ``POST /jobs/{key}/cancel|retry|remove``,
``/workers``, ``/login``, ``/metrics``, ``/healthz``, ``/static/*``. Every response carries a strict
Content-Security-Policy (scripts and styles from ``/static`` only), ``nosniff`` and no
referrer; with a token, every route but ``/healthz``, ``/login`` and ``/static`` needs it.
In front of all that, :class:`~ai_lease.ui.gate.Gate` refuses a foreign ``Host``, a
cross-site state change and an oversized body.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ai_lease.observe.phi import DEFAULT_THRESHOLD
from ai_lease.ui import actions, live, views
from ai_lease.ui.auth import COOKIE, OPEN_PATHS, Guard
from ai_lease.ui.gate import AllowedHosts, Gate
from ai_lease.ui.shared_reads import MAX_STREAMS, StreamSlots
from ai_lease.ui.views import Ui

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.observe.metrics import Metrics

__all__ = ["CSP", "create_app"]

STATIC = Path(__file__).resolve().parent / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
HEALTH_TIMEOUT = 2.0


class Secured:
    """ASGI middleware: the security headers on every response, and the token check."""

    def __init__(self, app: ASGIApp, ui: Ui) -> None:
        self.app, self.ui = app, ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                headers = [h for h in message.get("headers", []) if h[0] not in names]
                message = {**message, "headers": [*headers, *SECURITY_HEADERS]}
            await send(message)

        if self._allowed(scope):
            await self.app(scope, receive, send_secured)
        else:
            await self._refuse(scope)(scope, receive, send_secured)

    def _allowed(self, scope: Scope) -> bool:
        guard = self.ui.guard
        path: str = scope["path"]
        if not guard.required or path.startswith(OPEN_PATHS) or path == "/login":
            return True
        request = Request(scope)
        if guard.bearer_ok(request.headers.get("authorization")):
            return True
        session = guard.session(request.cookies.get(COOKIE))
        return session is not None and session.authenticated

    def _refuse(self, scope: Scope) -> Response:
        """401: an HTML page with a link to /login for browsers, one line for the rest."""
        request = Request(scope)
        headers = {"WWW-Authenticate": 'Bearer realm="ai-lease ui"'}
        if "text/html" not in request.headers.get("accept", ""):
            text = (
                "401: this dashboard needs its token: send Authorization: Bearer TOKEN, "
                "or log in at /login"
            )
            return PlainTextResponse(text, status_code=401, headers=headers)
        html = self.ui.templates.render(
            "error.html",
            title="Log in first",
            login=True,
            flash=None,
            stream=None,
            where="",
            message="This dashboard needs its access token.",
        )
        return HTMLResponse(html, status_code=401, headers=headers)


def _metrics_route(metrics: Metrics) -> Any:
    async def serve(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        # In a thread: the store gauges' collector waits for a read on this loop.
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return serve


async def healthz(request: Request) -> Response:
    """200 ``ok`` when the store answers a read within 2 s, else 503."""
    client = views.ui_of(request).client
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            await client.status("ai-lease-ui-healthz")
    except Exception:  # any failure to answer is "not healthy", and says nothing more
        return PlainTextResponse("store unavailable", status_code=503)
    return PlainTextResponse("ok")


Endpoint = Callable[[Request], Awaitable[Response]]


def _checked(endpoint: Endpoint) -> Endpoint:
    """``endpoint`` behind the check of the URL's job key and key prefix: one no job can
    have (a NUL: ``/jobs/a%00b``, ``?prefix=%00``) is a 400 page, never a store read."""

    async def serve(request: Request) -> Response:
        problem = views.url_problem(request)
        if problem is not None:
            return views.bad_request(request, problem)
        return await endpoint(request)

    return serve


def _routes(metrics: Metrics) -> list[Any]:
    return [
        Route("/", views.home),
        Route("/jobs", _checked(views.jobs)),
        # live streams apart from the pages: any key, "stream" or "a/stream" too, is a page
        Route("/live/jobs", _checked(live.jobs_stream)),
        Route("/live/jobs/{key:path}", _checked(live.job_stream)),
        Route("/jobs/{key:path}/cancel", _checked(actions.cancel), methods=["POST"]),
        Route("/jobs/{key:path}/retry", _checked(actions.retry), methods=["POST"]),
        Route("/jobs/{key:path}/remove", _checked(actions.remove), methods=["POST"]),
        Route("/jobs/{key:path}", _checked(views.job)),
        Route("/workers", views.workers),
        Route("/live/workers", live.workers_stream),
        Route("/login", views.login_form, methods=["GET"]),
        Route("/login", views.login, methods=["POST"]),
        Route("/metrics", _metrics_route(metrics)),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


def create_app(
    client: Client,
    *,
    token: str | None = None,
    refresh: float = 1.0,
    metrics: Metrics | None = None,
    settings_view: Mapping[str, str] | None = None,
    phi_threshold: float = DEFAULT_THRESHOLD,
    hosts: AllowedHosts | None = None,
    max_streams: int = MAX_STREAMS,
    lease_ttl: float | None = None,
) -> Starlette:
    """The dashboard over ``client``'s store (``Client(store)`` or :meth:`Client.open`;
    the caller closes it).

    ``token``: required of every request when given. ``refresh``: seconds between live
    updates. ``metrics``: the registry ``/metrics`` serves (a new one, with the store's
    gauges, by default). ``settings_view``: what the header shows, already masked
    (``{"store": mask_url(url)}``). ``phi_threshold``: the φ at which a job's owner reads
    "suspect" (``lease.phi_threshold``). ``hosts``: the ``Host`` names it answers
    (:meth:`AllowedHosts.for_bind`; by default the loopback names, any port): every other
    ``Host`` is refused before routing, as are cross-site state changes and large bodies
    (:mod:`ai_lease.ui.gate`). ``max_streams``: live pages served at once (then 503);
    pages on the same view share one store read per refresh. ``lease_ttl``: the lease
    length the workers use (``lease.ttl``), to mark where a lapsed lease expired on a job's
    timeline (without it, only while the record shows a lease).
    """
    if not refresh > 0:
        raise ValueError(f"refresh must be a positive number of seconds (got {refresh!r})")
    from ai_lease.observe.metrics import Metrics

    metrics = metrics if metrics is not None else Metrics()
    ui = Ui(
        client=client,
        guard=Guard(token),
        refresh=refresh,
        settings_view=dict(settings_view or {}),
        phi_threshold=phi_threshold,
        streams=StreamSlots(max_streams),
        lease_ttl=lease_ttl,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        collector = client.watch_gauges(metrics.registry)
        try:
            yield
        finally:
            metrics.registry.unregister(collector)

    app = Starlette(routes=_routes(metrics), lifespan=lifespan)
    app.state.ui = ui
    app.add_middleware(Secured, ui=ui)
    app.add_middleware(Gate, hosts=hosts)  # outermost: before the token, before any body
    return app
