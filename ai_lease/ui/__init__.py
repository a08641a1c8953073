"""``ai-lease ui``: a live web dashboard of the jobs, their health and their timelines.

Needs the ``ui`` extra (``pip install 'ai_lease[ui]'``: Starlette, uvicorn, sse-starlette).
:func:`~ai_lease.ui.app.create_app` builds the ASGI app over an open store; the modules:
:mod:`~ai_lease.ui.app` (routes, guard, headers), :mod:`~ai_lease.ui.auth` (token, session,
CSRF), :mod:`~ai_lease.ui.views` (pages), :mod:`~ai_lease.ui.actions` (cancel, retry,
remove), :mod:`~ai_lease.ui.live` (SSE), :mod:`~ai_lease.ui.listing` (the page of jobs),
:mod:`~ai_lease.ui.present` and :mod:`~ai_lease.ui.render` (how values are shown),
:mod:`~ai_lease.ui.timeline_svg` (a job's timeline as inline SVG).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ai_lease.ui.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ai_lease.ui.app import create_app

        return create_app
    raise AttributeError(f"module 'ai_lease.ui' has no attribute {name!r}")
