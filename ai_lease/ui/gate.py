"""The dashboard's front gate: which ``Host`` may reach it, which pages may act on it, and how
much a request may send — all checked before routing, before any body is read.

* **Host.** A page on another site can make a browser talk to a loopback port by pointing
  its own name at 127.0.0.1 (DNS rebinding); the browser then sends that site's name in
  ``Host``. Only the names the dashboard was bound under are accepted (``127.0.0.1``,
  ``localhost`` and ``[::1]`` for a loopback bind, the address itself otherwise, plus each
  ``--allowed-host`` for a reverse proxy); any other ``Host`` is a 400.
* **Origin.** A state-changing request (anything but GET, HEAD, OPTIONS) that a browser
  marks as coming from another site (``Origin`` of another host, ``Sec-Fetch-Site`` other
  than ``same-origin`` / ``none``, or ``Origin: null`` without ``Sec-Fetch-Site:
  same-origin`` — our own pages send ``null``, their Referrer-Policy being ``no-referrer``)
  is a 403, whatever else it carries. Requests without those headers are not from a
  browser page; they still need the CSRF token (forms) or the bearer token.
* **Size.** A body longer than :data:`MAX_BODY_BYTES` is a 413: refused from its
  ``Content-Length`` before it is read, or cut off while it streams in (chunked). Header
  bytes are bounded by the HTTP server (``ai-lease ui`` runs uvicorn's h11 parser with a
  limit), their number here (431).

>>> hosts = AllowedHosts.for_bind("127.0.0.1", 8377)
>>> hosts.admits("localhost:8377"), hosts.admits("evil.example:8377")
(True, False)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "LOOPBACK_NAMES",
    "MAX_BODY_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "AllowedHosts",
    "Gate",
]

LOOPBACK_NAMES: Final = ("127.0.0.1", "localhost", "[::1]")
MAX_BODY_BYTES: Final = 16_384  # the largest form the dashboard has is a few hundred bytes
MAX_HEADERS: Final = 100
MAX_HEADER_BYTES: Final = 16_384  # h11_max_incomplete_event_size for uvicorn, set by ai-lease ui
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_SITE: Final = frozenset({"same-origin", "none"})
_PLAIN: Final = {"X-Content-Type-Options": "nosniff", "Connection": "close"}


def split_host(value: str) -> tuple[str, int | None]:
    """``Host`` as (lower-cased name, port or None); IPv6 stays bracketed.

    >>> split_host("[::1]:8377"), split_host("LocalHost")
    (('[::1]', 8377), ('localhost', None))
    """
    value = value.strip().lower()
    name, sep, port = value.rpartition(":")
    if not sep or name.endswith(":") or (value.startswith("[") and not name.endswith("]")):
        return value, None  # no port (or a bare IPv6 address)
    return name, int(port) if port.isdigit() and len(port) <= 5 else -1


def _bracketed(host: str) -> str:
    """An IPv6 address in brackets, as it appears in ``Host``; anything else lower-cased."""
    bare = host.strip("[]")
    try:
        if ipaddress.ip_address(bare).version == 6:
            return f"[{bare}]"
    except ValueError:
        pass
    return host.lower()


@dataclass(frozen=True, slots=True)
class AllowedHosts:
    """The ``Host`` names (each with a port, or None for any port) the dashboard answers.

    ``any_host``: a wildcard bind (``0.0.0.0``, ``::``) with no ``--allowed-host`` — reached
    under names nobody listed, and therefore only served with a token (the command insists).
    """

    names: frozenset[tuple[str, int | None]]
    any_host: bool = False

    @classmethod
    def for_bind(cls, host: str, port: int | None, extra: Iterable[str] = ()) -> AllowedHosts:
        """The names a socket bound to ``host``:``port`` is reached under, plus ``extra``
        (``name`` for any port, ``name:port`` for one)."""
        listed = frozenset(split_host(_bracketed_entry(entry)) for entry in extra)
        bound = _bracketed(host)
        if bound in ("0.0.0.0", "[::]"):
            return cls(listed, any_host=not listed)
        own = LOOPBACK_NAMES if bound in LOOPBACK_NAMES or _is_loopback(bound) else ()
        mine = {(name, port) for name in (*own, bound)}
        return cls(frozenset(mine) | listed)

    def admits(self, host: str | None) -> bool:
        """Whether a request whose ``Host`` is ``host`` is for us."""
        if host is None or not host.strip():
            return False
        if self.any_host:
            return True
        name, port = split_host(host)
        if (name, None) in self.names:
            return True
        # Host leaves the scheme's default port out: 80 for http, 443 behind a TLS proxy
        return any((name, p) in self.names for p in ((80, 443) if port is None else (port,)))


def _bracketed_entry(entry: str) -> str:
    entry = entry.strip()
    if entry.count(":") > 1 and not entry.startswith("["):  # a bare IPv6 address
        return _bracketed(entry)
    return entry


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


class BodyTooLarge(Exception):
    """A body went past :data:`MAX_BODY_BYTES` while it streamed in."""


class Gate:
    """ASGI middleware: the Host, Origin and size checks above, before the app sees a byte.

    ``hosts``: the names to accept; None accepts the loopback names on any port (the app
    built without a bind in mind: tests, or an embedding that binds loopback itself).
    """

    def __init__(self, app: ASGIApp, hosts: AllowedHosts | None = None) -> None:
        loopback = frozenset((name, None) for name in LOOPBACK_NAMES)
        self.app, self.hosts = app, hosts or AllowedHosts(loopback)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            status, text = refusal
            refused = PlainTextResponse(text, status_code=status, headers=_PLAIN)
            await refused(scope, receive, send)
            return
        await self._bounded(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, one line) for a request refused at the gate, or None to let it in."""
        raw: Collection[tuple[bytes, bytes]] = scope.get("headers", ())
        if len(raw) > MAX_HEADERS:
            return 431, f"431: more than {MAX_HEADERS} request headers"
        headers = Headers(scope=scope)
        if not self.hosts.admits(headers.get("host")):
            return 400, "400: this dashboard does not answer for that Host"
        if scope["method"] not in SAFE_METHODS and not self._same_site(headers):
            return 403, "403: a page on another site cannot act on this dashboard"
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return 413, f"413: a request body may hold at most {MAX_BODY_BYTES} bytes"
        return None

    def _same_site(self, headers: Headers) -> bool:
        fetch_site = headers.get("sec-fetch-site")
        if fetch_site is not None and fetch_site.lower() not in SAME_SITE:
            return False
        origin = headers.get("origin")
        if origin is None:
            return True
        if origin == "null":  # our own pages send it too: their Referrer-Policy is no-referrer
            return fetch_site is not None and fetch_site.lower() == "same-origin"
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return False  # "null" (a sandboxed frame, a file: page) or anything odd
        if self.hosts.any_host:  # no list to check against: it must be this very Host
            return parts.netloc.lower() == (headers.get("host") or "").lower()
        return self.hosts.admits(parts.netloc)

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the body cut off at :data:`MAX_BODY_BYTES` as it streams in."""
        seen, started = 0, False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > MAX_BODY_BYTES:
                    raise BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except BodyTooLarge:
            if started:
                raise
            text = f"413: a request body may hold at most {MAX_BODY_BYTES} bytes"
            await PlainTextResponse(text, status_code=413, headers=_PLAIN)(scope, receive, send)
