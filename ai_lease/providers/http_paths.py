"""The lean adapter's two HTTP paths: an event stream's body as a ``read()`` per network read.

Each path POSTs (or GETs, for a body of None), checks the answer's status and content type
(:func:`check_answer`), and hands over one coroutine function: ``await read()`` is whatever
the next network read brought, decoded, and ``b""`` at the body's end. The aiohttp path is
aiohttp's ``StreamReader.readany`` itself, with nothing stacked on it; the httpx path is the
next piece of ``aiter_raw()`` (``aiter_bytes()`` for a server that compresses although
identity was asked).

Read timeouts are the libraries': aiohttp's ``sock_read`` (no byte for ``read_timeout``
seconds, the answer's head included) and httpx's read timeout.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping

import aiohttp
import httpx

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers.errors import describe_sent, status_error
from ai_lease.providers.rate_headers import heard

__all__ = [
    "Read",
    "aiohttp_reads",
    "check_answer",
    "http_path",
    "httpx_reads",
    "new_session",
]

log = logging.getLogger("ai_lease.providers.openai_compat")  # the adapter's own log, as before
Read = Callable[[], Awaitable[bytes]]
_ERROR_BODY = 64 * 1024  # how much of an error answer is read for its message


async def check_answer(
    provider: str,
    status: int,
    headers: Mapping[str, str],
    expect: str,
    read_body: Callable[[], Awaitable[bytes]],
    sent: Callable[[], str] | None = None,
) -> None:
    """Refuse an answer that is not a success of the ``expect``-ed content type; the body
    (read only then) gives the error its message, or, empty, ``sent()`` (what the request
    carried: :func:`~ai_lease.providers.errors.describe_sent`). A 3xx is refused too: it is
    a wrong ``base_url``, which no retry mends."""
    if status < 300:  # the rate-limit headers, to the call's [limits] (rate_headers.py)
        heard(headers)
    kind = headers.get("content-type", "")
    if status < 300 and expect in kind:
        return
    content = await read_body()
    if status >= 300:
        raise status_error(provider, status, content, headers, sent)
    raise ProviderError(
        f"expected {expect}, got {kind or 'no content type'}: {content[:80]!r}",
        retryable=True,
        provider=provider,
        partial=False,
    )


@contextlib.asynccontextmanager
async def aiohttp_reads(
    provider: str,
    session: aiohttp.ClientSession,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    shown_url: str,
    read_timeout: float | None = None,
    *,
    expect: str = "text/event-stream",
) -> AsyncGenerator[Read, None]:
    """The event stream's reads through aiohttp, after its status and type are checked;
    ``shown_url`` is ``url`` as the log may show it (no password); no byte for
    ``read_timeout`` seconds fails the stream (see the module's docstring)."""
    connect = session.timeout.sock_connect  # a request's timeout replaces the session's whole
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=connect, sock_read=read_timeout or None
    )
    method = "GET" if body is None else "POST"
    call = session.request(
        method, url, data=body, headers=headers, allow_redirects=False, timeout=timeout
    )
    async with call as response:
        # The exchange in one line, as httpx logs its own (never a header, so never a key)
        log.debug("HTTP Request: %s %s %d %s", method, shown_url, response.status, response.reason)
        content = response.content
        await check_answer(
            provider,
            response.status,
            response.headers,
            expect,
            lambda: _head_of(content, _ERROR_BODY),
            lambda: describe_sent(method, headers, body),
        )
        yield content.readany


@contextlib.asynccontextmanager
async def httpx_reads(
    provider: str,
    client: httpx.AsyncClient,
    url: str,
    body: bytes | None,
    headers: Mapping[str, str],
    *,
    expect: str = "text/event-stream",
) -> AsyncGenerator[Read, None]:
    """The same through httpx (``body`` None: a GET)."""
    method = "GET" if body is None else "POST"
    async with client.stream(method, url, content=body, headers=headers) as response:
        await check_answer(
            provider,
            response.status_code,
            response.headers,
            expect,
            response.aread,
            lambda: describe_sent(method, headers, body),
        )
        # Raw bytes: identity was asked for, so there is nothing to decode; a server that
        # compresses anyway goes through httpx's decoders.
        raw = response.aiter_raw() if _identity(response.headers) else response.aiter_bytes()
        async with contextlib.aclosing(raw) as chunks:  # type: ignore[type-var]
            pieces = aiter(chunks)

            def read() -> Awaitable[bytes]:
                return anext(pieces, b"")

            yield read


def new_session(max_connections: int, connect_timeout: float) -> aiohttp.ClientSession:
    """A provider's one aiohttp session (made inside the running loop that uses it); its
    read timeout is set per stream by :func:`aiohttp_reads`."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=None),
        trust_env=True,  # HTTP(S)_PROXY / NO_PROXY, as httpx does
    )


def http_path(http: str, client: httpx.AsyncClient | None) -> str:
    """``"aiohttp"`` or ``"httpx"``, from the ``http`` setting."""
    if http not in ("auto", "aiohttp", "httpx"):
        raise ConfigError(f"provider.http: {http!r} is not one of auto, aiohttp, httpx")
    if http == "auto":
        return "httpx" if client is not None else "aiohttp"
    return "httpx" if http == "httpx" else "aiohttp"


async def _head_of(content: aiohttp.StreamReader, limit: int) -> bytes:
    """At most ``limit`` bytes of a body (an error answer's message), however it arrives."""
    parts, size = [], 0
    while size < limit and (piece := await content.read(limit - size)):
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _identity(headers: Mapping[str, str]) -> bool:
    return headers.get("content-encoding", "identity").strip().lower() in ("", "identity")
