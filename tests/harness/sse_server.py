"""A scripted OpenAI-compatible HTTP/1.1 server on loopback, with upstream faults.

Raw bytes on asyncio streams, no web framework, so a test controls every byte and
every pause a streaming client sees. Responses are pure data built by helpers; the
server plays one per incoming request, first in, first out, whatever the path:

    async with SSEServer() as server:
        server.enqueue(
            sse(*chat_chunks(["Hel", "lo"], usage=(3, 2))),
            sse(*drip("slow", every=0.1), Hang()),
            json_response(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"}),
        )
        client = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        ...
        assert server.requests[0].json["stream"] is True

Wire format. A streamed response is ``text/event-stream`` with
``Transfer-Encoding: chunked``, as real servers send it; every event is written as
its own HTTP chunk and flushed. So a clean end (the zero-length terminating chunk)
is distinguishable from a ``Cut()`` (FIN without it: h11 reports an incomplete
chunked read) and from a ``Reset()`` (RST). ``sse(..., chunked=False)`` sends the
older ``Connection: close`` framing instead (no length, the body ends at FIN): there
a ``Cut()`` looks exactly like a clean end, which is how a client can miss a
truncated stream. Fixed responses carry a Content-Length. Connections are kept
alive between complete responses, as HTTP/1.1 clients expect.

While a response plays, the server watches the connection: a client that closes it
(a timeout, a cancelled stream) stops the script at once, so ``connections_open``
tells whether a client really let go of its upstream connection.

Modes beyond the queue: ``SSEServer(responder=f)`` answers with ``f(request)`` whenever
nothing is queued (a server for many concurrent clients); ``interrupt_on_request=True``
acts as llama.cpp's server does by default (``interrupt_requests``): a new request ends
every stream then playing with ``data: [DONE]`` and no finish chunk, a clean end of the
body. ``Repeat(data)`` sends the same bytes again and again (an endless line, an endless
stream of large events) until the client leaves; ``bytes_sent`` counts what went out.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeAlias

import orjson

__all__ = [
    "Cut",
    "Event",
    "Hang",
    "Repeat",
    "Request",
    "Reset",
    "Response",
    "SSEServer",
    "Sleep",
    "chat_chunks",
    "completion_json",
    "drip",
    "json_response",
    "raw",
    "sse",
]

_READ_BYTES = 65536
_CLOSE_TIMEOUT_S = 1.0
_POLL_S = 0.005
_CREATED = 1_700_000_000
_DONE_EVENT = b"data: [DONE]\n\n"
_LAST_CHUNK = b"0\r\n\r\n"


# -- script steps --------------------------------------------------------------


@dataclass(frozen=True)
class Sleep:
    """Pause the stream for ``seconds`` before the next event."""

    seconds: float


@dataclass(frozen=True)
class Hang:
    """Send nothing more; hold the connection until the client (or ``aclose()``) closes it."""


@dataclass(frozen=True)
class Cut:
    """Close the connection right here (FIN), without the terminating chunk."""


@dataclass(frozen=True)
class Reset:
    """Abort the connection right here with a TCP RST (SO_LINGER 0)."""


@dataclass(frozen=True)
class Repeat:
    """Send ``data`` ``times`` times (None: until the client leaves), each as its own chunk."""

    data: bytes
    times: int | None = None


Event: TypeAlias = dict[str, Any] | bytes | Sleep | Hang | Cut | Reset | Repeat
"""A dict is sent as ``data: <json>\\n\\n``; bytes go out verbatim; a step acts."""

_ENDINGS = (Hang, Cut, Reset)


# -- responses -----------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    """One scripted reply. Build it with ``sse``, ``json_response`` or ``raw``.

    ``events is None`` means a fixed ``body`` with a Content-Length; otherwise the
    events are streamed, ``chunked`` or ended by closing the connection.
    ``delay_s`` passes before the status line.
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""
    events: tuple[Event, ...] | None = None
    delay_s: float = 0.0
    chunked: bool = True


def sse(
    *events: Event,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    done: bool = True,
    delay: float = 0.0,
    chunked: bool = True,
) -> Response:
    """A ``text/event-stream`` playing ``events`` in order, ``delay`` s after the request.

    ``done`` appends ``data: [DONE]``; the body then ends properly either way (the
    terminating chunk, or FIN when ``chunked=False``), unless a ``Hang``, ``Cut`` or
    ``Reset`` ends the stream first (it must be the last event).

        sse({"n": 1}, b": ping\\n\\n", Sleep(0.1), {"n": 2}, Cut())
    """
    for index, event in enumerate(events[:-1]):
        if isinstance(event, _ENDINGS):
            raise ValueError(
                f"sse(): {event!r} at position {index} ends the stream, so the "
                f"{len(events) - index - 1} event(s) after it would never be sent; "
                "put it last"
            )
    if done and not (events and isinstance(events[-1], _ENDINGS)):
        events = (*events, _DONE_EVENT)
    base = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    base |= {"Transfer-Encoding": "chunked"} if chunked else {"Connection": "close"}
    return Response(status, _merge(base, headers), events=events, delay_s=delay, chunked=chunked)


def json_response(
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    delay: float = 0.0,
) -> Response:
    """A JSON reply with a Content-Length, sent after ``delay`` seconds.

    json_response(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
    """
    return raw(status, orjson.dumps(body), "application/json", headers=headers, delay=delay)


def raw(
    status: int,
    body: bytes,
    content_type: str = "text/html",
    *,
    headers: Mapping[str, str] | None = None,
    delay: float = 0.0,
) -> Response:
    """Any fixed body with a Content-Length, e.g. a proxy's HTML error page.

    raw(200, b"<html>Gateway login</html>")
    """
    base = {"Content-Type": content_type, "Content-Length": str(len(body))}
    return Response(status, _merge(base, headers), body=body, delay_s=delay)


def _merge(base: Mapping[str, str], extra: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    merged = {name.lower(): (name, value) for name, value in base.items()}
    merged.update({name.lower(): (name, value) for name, value in (extra or {}).items()})
    return tuple(merged.values())


# -- OpenAI-shaped bodies --------------------------------------------------------


def chat_chunks(
    texts: Iterable[str],
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | None = None,
    model: str = "m",
) -> list[dict[str, Any]]:
    """``chat.completion.chunk`` events as OpenAI streams them.

    A role chunk, one content delta per text, a chunk carrying ``finish_reason``
    (left out when it is None: a model cut off mid-answer), and, when ``usage`` is
    ``(prompt_tokens, completion_tokens)``, a last chunk with ``choices: []`` and
    the usage, as ``stream_options={"include_usage": True}`` makes OpenAI send.

        sse(*chat_chunks(["Hel", "lo"], usage=(3, 2)))
    """
    deltas: list[tuple[dict[str, Any], str | None]] = [({"role": "assistant", "content": ""}, None)]
    deltas += [({"content": text}, None) for text in texts]
    if finish_reason is not None:
        deltas.append(({}, finish_reason))
    chunks = [_chunk(model, [_choice(delta, reason)], usage) for delta, reason in deltas]
    if usage is not None:
        chunks.append(_chunk(model, [], usage, last=True))
    return chunks


def drip(
    text: str,
    every: float,
    chunk_size: int = 1,
    *,
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | None = None,
    model: str = "m",
) -> list[Event]:
    """``chat_chunks`` of ``text`` in ``chunk_size`` pieces, each after ``Sleep(every)``.

    The role chunk goes out at once, so the first content arrives ``every`` seconds
    after the headers and each next one ``every`` seconds later.

        sse(*drip("hello", every=0.05, chunk_size=2))  # "he", "ll", "o"
    """
    if chunk_size < 1:
        raise ValueError(f"drip(): chunk_size must be >= 1, got {chunk_size}")
    pieces = [text[i : i + chunk_size] for i in range(0, len(text), chunk_size)]
    chunks = chat_chunks(pieces, finish_reason, usage, model)
    events: list[Event] = [chunks[0]]
    for chunk in chunks[1 : 1 + len(pieces)]:
        events += [Sleep(every), chunk]
    events += chunks[1 + len(pieces) :]
    return events


def completion_json(
    text: str,
    usage: tuple[int, int] | None = None,
    *,
    model: str = "m",
    finish_reason: str = "stop",
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body, for ``json_response(200, ...)``."""
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": _CREATED,
        "model": model,
        "system_fingerprint": "fp_test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
    }
    if usage is not None:
        body["usage"] = _usage(usage)
    return body


def _choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def _chunk(
    model: str,
    choices: list[dict[str, Any]],
    usage: tuple[int, int] | None,
    *,
    last: bool = False,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
        "system_fingerprint": "fp_test",
        "choices": choices,
    }
    if usage is not None:  # with include_usage, OpenAI sends "usage": null until the end
        chunk["usage"] = _usage(usage) if last else None
    return chunk


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    prompt, completion = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


# -- requests --------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request as received: header names lower-cased, ``json`` None if not JSON."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = field(default=None, repr=False)


class _Disconnected(Exception):
    """The client closed or reset the connection while a response was playing."""


class _Connection:
    """One client connection: read requests, play responses, notice the client leave."""

    def __init__(
        self, server: SSEServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader, self.writer = reader, writer
        self.buffer = bytearray()
        self.interrupt: asyncio.Event | None = None  # set while a stream plays

    async def run(self) -> None:
        """Serve requests until a response ends the connection or the client leaves."""
        try:
            while (request := await self._read_request()) is not None:
                self.server.requests.append(request)
                if self.server.interrupt_on_request:
                    self.server._interrupt_streams()
                keep_alive = await self._play_watched(self.server._next_response(request))
                if not keep_alive or request.headers.get("connection") == "close":
                    break
        except (OSError, _Disconnected, ValueError):
            pass  # a client gone or talking nonsense just loses its connection
        finally:
            await self.close()

    # -- reading ---------------------------------------------------------------

    async def _fill(self) -> bool:
        data = await self.reader.read(_READ_BYTES)
        self.buffer += data
        return bool(data)

    async def _read_until(self, separator: bytes) -> bytes | None:
        while (index := self.buffer.find(separator)) < 0:
            if not await self._fill():
                return None
        line = bytes(self.buffer[:index])
        del self.buffer[: index + len(separator)]
        return line

    async def _read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not await self._fill():
                raise _Disconnected("request body cut short")
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def _read_request(self) -> Request | None:
        head = await self._read_until(b"\r\n\r\n")
        if head is None:
            return None
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._read_chunked_body()
        else:
            body = await self._read_exactly(int(headers.get("content-length", "0")))
        return Request(method, path, headers, body, _parse_json(body))

    async def _read_chunked_body(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self._read_until(b"\r\n")
            if size_line is None:
                raise _Disconnected("chunked request body cut short")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                await self._read_until(b"\r\n")  # no trailers expected
                return bytes(body)
            body += await self._read_exactly(size + 2)
            del body[-2:]

    async def _watch_for_close(self) -> None:
        """Return once the client closes its side; keep any early bytes for the next request."""
        try:
            while await self._fill():
                pass
        except OSError:
            pass

    # -- writing ---------------------------------------------------------------

    async def _play_watched(self, response: Response) -> bool:
        """Play ``response`` unless the client leaves first; True if the connection is reusable."""
        player = asyncio.create_task(self._play(response))
        watcher = asyncio.create_task(self._watch_for_close())
        try:
            await asyncio.wait((player, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (player, watcher):
                task.cancel()
            await asyncio.gather(player, watcher, return_exceptions=True)
        if player.cancelled():
            return False  # the client left first
        return player.result()

    async def _play(self, response: Response) -> bool:
        if response.delay_s:
            await asyncio.sleep(response.delay_s)
        await self._send(_status_and_headers(response))
        if response.events is None:
            await self._send(response.body)
            return True
        self.interrupt = interrupt = asyncio.Event()
        try:
            for event in response.events:
                if interrupt.is_set():
                    self.server.interrupted += 1
                    await self._send_data(_DONE_EVENT, response.chunked)
                    break
                if not await self._play_event(event, response.chunked):
                    return False
        finally:
            self.interrupt = None
        if not response.chunked:
            return False  # the FIN is the end of the body
        await self._send(_LAST_CHUNK)
        return True

    async def _play_event(self, event: Event, chunked: bool) -> bool:
        """Send or act out one event; False once the stream is over."""
        match event:
            case Sleep(seconds):
                if self.interrupt is None:
                    await asyncio.sleep(seconds)
                else:  # an interruption ends the pause at once
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.interrupt.wait(), seconds)
            case Repeat(data, times):
                count = 0
                while times is None or count < times:
                    await self._send_data(data, chunked)
                    count += 1
            case Hang():
                await asyncio.Future()  # until the watcher sees the client leave, or aclose()
            case Cut():
                return False  # close() sends FIN; the terminating chunk never goes out
            case Reset():
                self.abort_with_rst()
                return False
            case dict():
                await self._send_data(b"data: " + orjson.dumps(event) + b"\n\n", chunked)
            case bytes():
                await self._send_data(event, chunked)
        return True

    async def _send_data(self, data: bytes, chunked: bool) -> None:
        if data:  # an empty chunk would end the body
            await self._send(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)

    async def _send(self, data: bytes) -> None:
        self.server.bytes_sent += len(data)
        self.writer.write(data)
        await self.writer.drain()

    # -- closing ---------------------------------------------------------------

    def abort_with_rst(self) -> None:
        sock = self.writer.get_extra_info("socket")
        if sock is not None and not self.writer.transport.is_closing():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def close(self) -> None:
        """Close the connection and wait until the transport is gone. Idempotent."""
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), _CLOSE_TIMEOUT_S)
        except (OSError, TimeoutError):
            self.writer.transport.abort()  # a stuck peer must not hang the test


def _parse_json(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _status_and_headers(response: Response) -> bytes:
    try:
        reason = http.HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# -- the server ------------------------------------------------------------------


class SSEServer:
    """A loopback HTTP/1.1 server answering each request with the next scripted response.

    With nothing queued it answers 500 with a JSON error saying so.

        async with SSEServer() as server:
            server.enqueue(sse(*chat_chunks(["hi"])))
            async with httpx.AsyncClient(base_url=server.base_url) as client:
                ...
            assert server.requests[0].path == "/v1/chat/completions"
    """

    def __init__(
        self,
        *,
        responder: Callable[[Request], Response] | None = None,
        interrupt_on_request: bool = False,
    ) -> None:
        self.responder, self.interrupt_on_request = responder, interrupt_on_request
        self.interrupted = 0  # streams ended by interrupt_on_request
        self.bytes_sent = 0
        self.requests: list[Request] = []
        self._responses: deque[Response] = deque()
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Connection] = {}

    def __repr__(self) -> str:
        port = self._server and self.port
        return (
            f"SSEServer(:{port}, queued={len(self._responses)}, "
            f"requests={len(self.requests)}, open={self.connections_open})"
        )

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> SSEServer:
        """Listen on a free port of 127.0.0.1."""
        if self._server is not None:
            raise RuntimeError(f"{self!r} is already started")
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("SSEServer is not listening: await start() first")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the ``base_url`` an OpenAI client expects."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def connections_open(self) -> int:
        """Client connections accepted and not yet closed (kept-alive ones included)."""
        return len(self._connections)

    async def wait_connections_open(self, count: int = 0, timeout_s: float = 2.0) -> None:
        """Wait until ``connections_open == count``; a client closes its side asynchronously."""
        deadline = time.monotonic() + timeout_s
        while self.connections_open != count:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{self!r}: still {self.connections_open} connection(s) open after "
                    f"{timeout_s} s, expected {count}; did the client close its stream?"
                )
            await asyncio.sleep(_POLL_S)

    async def aclose(self) -> None:
        """Stop listening, close every connection (hanging ones too) and await their tasks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        connections = dict(self._connections)
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)
        for connection in connections.values():
            await connection.close()  # a task cancelled before it ran never closed its socket
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> SSEServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- script ------------------------------------------------------------------

    def enqueue(self, *responses: Response) -> None:
        """Queue responses; each incoming request takes the oldest one."""
        self._responses.extend(responses)

    def _interrupt_streams(self) -> None:
        for connection in self._connections.values():
            if connection.interrupt is not None:
                connection.interrupt.set()

    def _next_response(self, request: Request) -> Response:
        if self._responses:
            return self._responses.popleft()
        if self.responder is not None:
            return self.responder(request)
        message = (
            f"no scripted response for {request.method} {request.path} "
            f"(request #{len(self.requests)}): enqueue one more"
        )
        return json_response(500, {"error": {"message": message, "type": "server_error"}})

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Hand the connection to a task this server owns and can cancel.

        (Cancelling the handler task asyncio itself makes trips a 3.11 bug that
        logs "Exception in callback", so that callback only hands over.)
        """
        if self._server is None:
            writer.close()  # accepted just as aclose() ran: refuse
            return
        connection = _Connection(self, reader, writer)
        task = asyncio.create_task(connection.run())
        self._connections[task] = connection
        task.add_done_callback(self._connections.pop)
