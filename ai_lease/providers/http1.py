"""A small HTTP/1.1 client for one kind of exchange: a POST whose answer streams back.

The lean adapter's fast path. httpx (httpcore + h11) spends ~10 µs of pure Python per
HTTP chunk before its caller sees a byte, and inference servers (uvicorn under vLLM,
llama.cpp, Ollama) send every server-sent event as its own chunk: that cost, not parsing,
bounded how many streams one process could hold. This client takes whatever one socket
read holds and de-chunks it with bytes operations, a fraction of a microsecond per chunk
(figures in docs/benchmarks.md).

Deliberately narrow — what a streamed chat call needs and nothing more:

* ``http://`` and ``https://`` (TLS with httpx's default context), HTTP/1.1; no proxies
  (the adapter goes through httpx when one applies), no redirects, no cookies;
* bodies framed by ``Transfer-Encoding: chunked``, ``Content-Length`` or the close of the
  connection; gzip and deflate decoded if a server compresses although identity was asked;
* keep-alive: a connection whose answer was read to its end goes back to a small pool per
  origin for up to ``keep_alive`` seconds. A request is never sent twice by this client: one
  that fails on a reused connection is a transport error for the caller's retry policy
  (it may have reached the server, and a model call made twice costs twice);
* timeouts: connecting, and each read (no byte for ``read_timeout``). The stream guard and
  the stage deadline bound the rest from outside.

Every failure is an :class:`HTTP1Error` (``OSError`` and timeouts included), so callers
translate one exception type.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["HTTP1Client", "HTTP1Error", "HTTP1Timeout", "Response"]

_MAX_HEAD = 64 * 1024  # status line + headers
_MAX_LINE = 4 * 1024  # a chunk-size line or a trailer
_HIGH_WATER = 1024 * 1024  # stop reading the socket while this much is unread
_HEX = b"0123456789abcdefABCDEF"

log = logging.getLogger(__name__)


class HTTP1Error(Exception):
    """A connection that failed or an answer that is not well-formed HTTP/1.1."""


class HTTP1Timeout(HTTP1Error):
    """No connection, or no byte of the answer, within its timeout."""


Origin = tuple[str, str, int]  # scheme, host, port


class _Reader(asyncio.Protocol):
    """Buffers what the socket delivers; :meth:`read` hands over all of it at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.eof = False
        self.error: BaseException | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = self.error or exc
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- reading --------------------------------------------------------------------------------

    @property
    def idle_and_open(self) -> bool:
        """Fit for another request: open, nothing unread, no end seen."""
        t = self.transport
        return t is not None and not t.is_closing() and not self.eof and not self._chunks

    async def read(self, timeout: float) -> bytes:
        """Everything received since the last read; ``b""`` once the peer has closed."""
        if not self._chunks:
            if self.eof:
                if self.error is not None:
                    raise HTTP1Error(f"connection lost: {self.error!r}")
                return b""
            waiter = self._waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, _expire, waiter, timeout)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
            if not self._chunks:
                return await self.read(timeout)  # woken by the end of the stream
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data


def _expire(waiter: asyncio.Future[None], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(HTTP1Timeout(f"read timeout: no data for {timeout:g}s"))


class Response:
    """Status, headers (names lower-cased) and the body, read once as it arrives."""

    def __init__(
        self,
        reader: _Reader,
        status: int,
        reason: str,
        headers: dict[str, str],
        rest: bytes,
        read_timeout: float,
        keep_alive: bool,
    ) -> None:
        self.status, self.reason, self.headers = status, reason, headers
        self._reader, self._rest, self._timeout = reader, rest, read_timeout
        self._keep_alive = keep_alive
        self.complete = False  # the body was read to its end
        self.reusable = False  # ... and the connection may carry another request

    async def aiter_body(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes, de-chunked and decoded, one piece per socket read."""
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            async for piece in self._aiter_raw():
                yield piece
            return
        if encoding not in ("gzip", "x-gzip", "deflate"):
            raise HTTP1Error(f"unsupported content-encoding {encoding!r}")
        inflate = zlib.decompressobj(47)  # gzip or zlib header, detected
        try:
            async for piece in self._aiter_raw():
                if out := inflate.decompress(piece):
                    yield out
            if tail := inflate.flush():
                yield tail
        except zlib.error as exc:
            raise HTTP1Error(f"undecodable {encoding} body: {exc}") from None

    async def read(self, limit: int = 1 << 20) -> bytes:
        """The body (at most ``limit`` bytes of it; the rest is left unread)."""
        parts, size = [], 0
        async with contextlib.aclosing(self.aiter_body()) as body:
            async for piece in body:
                parts.append(piece)
                size += len(piece)
                if size >= limit:
                    break
        return b"".join(parts)[:limit]

    def _aiter_raw(self) -> AsyncIterator[bytes]:
        if self.status in (204, 304) or 100 <= self.status < 200:
            return self._empty()
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            return self._dechunk()
        length = self.headers.get("content-length")
        if length is not None:
            return self._sized(_content_length(length))
        self._keep_alive = False  # the body ends where the connection does
        return self._until_close()

    async def _empty(self) -> AsyncGenerator[bytes, None]:
        self._done(self._rest)
        return
        yield b""  # pragma: no cover - makes this an async generator

    async def _sized(self, length: int) -> AsyncGenerator[bytes, None]:
        data, self._rest = self._rest, b""
        remaining = length
        while True:
            if len(data) >= remaining:
                if remaining:
                    yield data[:remaining]
                self._done(data[remaining:])
                return
            if data:
                yield data
                remaining -= len(data)
            data = await self._reader.read(self._timeout)
            if not data:
                raise HTTP1Error(f"the connection closed {remaining} bytes before the body's end")

    async def _until_close(self) -> AsyncGenerator[bytes, None]:
        data, self._rest = self._rest, b""
        read, timeout = self._reader.read, self._timeout
        while True:
            if data:
                yield data
            data = await read(timeout)
            if not data:
                self.complete = True
                return

    async def _dechunk(self) -> AsyncGenerator[bytes, None]:
        """``Transfer-Encoding: chunked``: every complete chunk in a read, joined."""
        buf, self._rest = self._rest, b""
        read, timeout = self._reader.read, self._timeout
        pos = 0
        owed = -1  # -1: a size line is next; else data bytes the current chunk still owes
        while True:
            out: list[bytes] = []
            end = len(buf)
            while True:
                if owed < 0:
                    eol = buf.find(b"\r\n", pos)
                    if eol < 0:
                        if end - pos > _MAX_LINE:
                            raise HTTP1Error("malformed chunked body: chunk-size line too long")
                        break
                    owed = _chunk_size(buf[pos:eol])
                    pos = eol + 2
                    if owed == 0:
                        # The end is read before the last data is handed over: a reader
                        # that stops at that data (an SSE [DONE]) still leaves a response
                        # read to its end, whose connection can carry the next request.
                        ended = self._end_of_trailers(buf[pos:])
                        if out:
                            yield b"".join(out)
                        if not ended:
                            await self._trailers(buf[pos:])
                        return
                have = end - pos
                if have >= owed + 2:  # the rest of the chunk and its CRLF are here
                    stop = pos + owed
                    if buf[stop : stop + 2] != b"\r\n":
                        raise HTTP1Error("malformed chunked body: a chunk longer than its size")
                    out.append(buf[pos:stop])
                    pos, owed = stop + 2, -1
                    continue
                take = min(have, owed)  # hand over what is here; the CRLF is checked later
                if take:
                    out.append(buf[pos : pos + take])
                    pos += take
                    owed -= take
                break
            if out:
                yield out[0] if len(out) == 1 else b"".join(out)
            more = await read(timeout)
            if not more:
                raise HTTP1Error("the connection closed inside a chunked body")
            buf = buf[pos:] + more if pos < end else more
            pos = 0

    def _end_of_trailers(self, tail: bytes) -> bool:
        """If ``tail`` holds the whole trailer section (usually just CRLF), finish the body."""
        if tail.startswith(b"\r\n"):
            self._done(tail[2:])
            return True
        blank = tail.find(b"\r\n\r\n")
        if blank >= 0:
            self._done(tail[blank + 4 :])
            return True
        return False

    async def _trailers(self, tail: bytes) -> None:
        """Skip the trailer section after the last chunk."""
        while True:
            if self._end_of_trailers(tail):
                return
            if len(tail) > _MAX_HEAD:
                raise HTTP1Error("malformed chunked body: trailers too long")
            more = await self._reader.read(self._timeout)
            if not more:  # the body was whole; only the connection cannot be reused
                self.complete = True
                return
            tail += more

    def _done(self, leftover: bytes) -> None:
        self.complete = True
        self.reusable = self._keep_alive and not leftover and self._reader.idle_and_open


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()
    if not digits or len(digits) > 16 or digits.strip(_HEX):
        raise HTTP1Error(f"malformed chunked body: bad chunk size {line[:40]!r}")
    return int(digits, 16)


def _content_length(value: str) -> int:
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1 or not (length := values.pop()).isdigit():
        raise HTTP1Error(f"bad content-length {value!r}")
    return int(length)


def _parse_head(head: bytes) -> tuple[int, str, dict[str, str], bool]:
    """Status, reason, headers and whether the connection stays open after this answer."""
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise HTTP1Error(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HTTP1Error(f"malformed header line {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and "close" not in connection
    return int(code), reason, headers, keep_alive


class HTTP1Client:
    """Connections to any number of origins, kept alive between requests.

    >>> client = HTTP1Client(connect_timeout=10, read_timeout=600)
    >>> async with client.stream("POST", url, headers, body) as response:  # doctest: +SKIP
    ...     async for piece in response.aiter_body():
    ...         ...
    """

    def __init__(
        self,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        max_idle_per_origin: int = 64,
        keep_alive: float = 4.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_idle_per_origin = max_idle_per_origin
        # Below the usual server keep-alive timeouts (uvicorn 5 s): a connection idle longer
        # may be closed by the server just as a request goes out on it.
        self.keep_alive = keep_alive
        self._ssl = ssl_context
        self._idle: dict[Origin, list[tuple[_Reader, float]]] = {}

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> AsyncGenerator[Response, None]:
        """Send one request; the answer's body is read inside the ``async with``.

        Leaving the block before the body's end closes the connection; a body read to its
        end lets the connection carry the next request.
        """
        origin, request = self._render(method, url, headers, body)
        reader, response = await self._exchange(origin, request)
        log.debug("HTTP Request: %s %s %d %s", method, url, response.status, response.reason)
        try:
            yield response
        finally:
            self._release(origin, reader, response.reusable)

    async def aclose(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for readers in idle.values():
            for reader, _ in readers:
                if reader.transport is not None:
                    reader.transport.close()

    # -- internals ------------------------------------------------------------------------------

    def _render(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[Origin, bytes]:
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        if scheme not in ("http", "https") or not host:
            raise HTTP1Error(f"not an http(s) URL: {url!r}")
        default = 443 if scheme == "https" else 80
        try:
            port = parts.port or default
        except ValueError as exc:
            raise HTTP1Error(f"bad port in {url!r}: {exc}") from None
        authority = f"[{host}]" if ":" in host else host
        if port != default:
            authority += f":{port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}"]
        given = {k.lower() for k in headers}
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
                raise HTTP1Error(f"header {name!r} holds a line break or colon")
            lines.append(f"{name}: {value}")
        if "content-length" not in given:
            lines.append(f"Content-Length: {len(body)}")
        if "user-agent" not in given:
            lines.append("User-Agent: ai-lease")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return (scheme, host, port), head + body

    async def _exchange(self, origin: Origin, request: bytes) -> tuple[_Reader, Response]:
        # Never sent twice here: a request that fails on a kept-alive connection may have
        # reached the server (a model call made twice costs twice). The failure is a
        # transport error the caller's retry policy decides on, visibly.
        reader = self._checkout(origin) or await self._connect(origin)
        try:
            assert reader.transport is not None
            reader.transport.write(request)
            return reader, await self._read_head(reader)
        except BaseException:
            self._discard(reader)
            raise

    async def _read_head(self, reader: _Reader) -> Response:
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                status, reason, headers, keep_alive = _parse_head(buf[:end])
                rest = buf[end + 4 :]
                if 100 <= status < 200 and status != 101:  # informational: the answer follows
                    buf = rest
                    continue
                if status == 101:
                    raise HTTP1Error("unexpected 101 Switching Protocols")
                return Response(
                    reader, status, reason, headers, rest, self.read_timeout, keep_alive
                )
            if len(buf) > _MAX_HEAD:
                raise HTTP1Error("the answer's headers are too long")
            more = await reader.read(self.read_timeout)
            if not more:
                if not buf:
                    raise HTTP1Error("the server closed the connection without answering")
                raise HTTP1Error("the connection closed inside the answer's headers")
            buf += more

    async def _connect(self, origin: Origin) -> _Reader:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if scheme == "https":
            tls = {"ssl": self._ssl_context(), "server_hostname": host}
        reader = _Reader(loop)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.create_connection(lambda: reader, host, port, **tls)
        except TimeoutError:
            raise HTTP1Timeout(
                f"connect timeout: no connection to {host}:{port} in {self.connect_timeout:g}s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise HTTP1Error(f"cannot connect to {host}:{port}: {exc}") from None
        return reader

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            import httpx  # its default context: certifi's roots, SSL_CERT_FILE honoured

            self._ssl = httpx.create_ssl_context()
        return self._ssl

    def _checkout(self, origin: Origin) -> _Reader | None:
        idle = self._idle.get(origin)
        now = asyncio.get_running_loop().time()
        while idle:
            reader, since = idle.pop()
            if reader.idle_and_open and now - since < self.keep_alive:
                return reader
            self._discard(reader)
        return None

    def _release(self, origin: Origin, reader: _Reader, reusable: bool) -> None:
        idle = self._idle.setdefault(origin, [])
        if reusable and reader.idle_and_open and len(idle) < self.max_idle_per_origin:
            idle.append((reader, asyncio.get_running_loop().time()))
        else:
            self._discard(reader)

    @staticmethod
    def _discard(reader: _Reader) -> None:
        if reader.transport is not None and not reader.transport.is_closing():
            reader.transport.abort()
