"""``openai-compatible``: a lean streaming client for any OpenAI-compatible server.

OpenAI itself, vLLM, Ollama, llama.cpp's server, LM Studio… anything that speaks
``POST {base_url}/chat/completions`` with server-sent events. It exists beside the official
SDK adapter for speed: with streams paced as models send them (one event per write) it
spends about a quarter to a third of the SDK's CPU per event, which decides how many streams
one process can hold (figures in docs/benchmarks.md).

Two HTTP paths, one parser: ``http="aiohttp"`` streams through aiohttp (its llhttp parser
in C: TLS, proxies from the environment, decompression, keep-alive, connect and read
timeouts are aiohttp's); ``http="httpx"`` streams through httpx. ``"auto"`` (the default)
is aiohttp unless a caller passes its own httpx ``client=``, which always means httpx; a call
that is not streamed always goes through httpx. ``"fast"`` (the name of a hand-written
HTTP/1.1 reader this replaced) is accepted as an alias of ``"aiohttp"``.

Both paths hold at most ``max_connections`` streams at once; a stream that finds them all
busy waits at most ``pool_timeout`` (default: the connect timeout) and then fails with
:class:`PoolTimeout`. Waiting is not model latency: the stream's first batch is empty and
says "connection held", and the stream guard starts its first-token clock there.

It is strict where the SDK is lenient: a stream that ends before ``[DONE]``, a 200 that is
not an event stream, or a chunk that is not JSON is a :class:`ProviderError`, never a
silently short answer; a ``[DONE]`` with no finish reason before it is
:class:`StreamInterrupted` (llama.cpp's server ends a running stream so when another request
arrives), and a 200 event stream with no events at all is :class:`EmptyEventStream`.
SSE comments (``: ping``) are skipped and are never progress. One event may hold at most
``max_event_bytes``: the reader's buffer never grows past it, and a longer event (an endless
line) closes the connection with :class:`StreamLimitExceeded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
from pydantic import SecretStr

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    PoolTimeout,
    ProviderError,
    StreamInterrupted,
    StreamLimitExceeded,
)
from ai_lease.job import sampling_problem
from ai_lease.lease.urls import mask_url
from ai_lease.providers.base import ChatRequest, Completion, Delta, Usage
from ai_lease.providers.errors import status_error
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import StreamLimits

log = logging.getLogger(__name__)
HTTPPath = Literal["auto", "aiohttp", "httpx", "fast"]  # "fast": the old name of "aiohttp"
_ERROR_BODY = 64 * 1024  # how much of an error answer is read for its message

__all__ = ["OpenAICompatProvider", "check_base_url", "request_body"]


def request_body(
    request: ChatRequest,
    default_model: str | None,
    stream: bool,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a chat completion request; ``defaults`` (the provider's configured
    ``temperature`` / ``max_tokens``) fill what the request leaves unset."""
    model = request.model or default_model
    if not model:
        raise ConfigError("provider.model: no model given (set it in the job or the settings)")
    body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in request.messages]}
    for name in ("temperature", "max_tokens"):
        value = getattr(request, name)
        if value is None and defaults:
            value = defaults.get(name)
        if value is not None:
            body[name] = value
    if request.stop:
        body["stop"] = list(request.stop)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(request.extra)
    return body


def check_base_url(base_url: str) -> str:
    """``base_url`` if it can name a server, else a :class:`ConfigError` (no retry mends it)."""
    shown = mask_url(base_url[:200])  # never a password, never a whole 10 KB value
    try:
        parts = urlsplit(base_url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(
            f"provider.base_url: {shown!r} is not a valid URL ({exc}); "
            "give one like http://127.0.0.1:8080/v1"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise ConfigError(
            f"provider.base_url: {shown!r} is not an http(s) URL with a host and a port "
            "from 1 to 65535; give one like http://127.0.0.1:8080/v1"
        )
    return base_url


def sampling_defaults(temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
    """A provider's configured sampling settings, checked: what a request leaves unset."""
    problem = sampling_problem(temperature, max_tokens)
    if problem:
        raise ConfigError(f"provider.{problem}")
    out: dict[str, Any] = {}
    if temperature is not None:
        out["temperature"] = float(temperature)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    return out


def _usage(data: Mapping[str, Any] | None) -> Usage | None:
    if not data:
        return None
    return Usage(int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0))


class OpenAICompatProvider(AsyncResource):
    """Streams chat completions from ``base_url`` (default OpenAI's) with aiohttp or httpx.

    >>> provider = OpenAICompatProvider(base_url="http://127.0.0.1:8000/v1", model="qwen2.5")
    """

    name = "openai-compatible"
    announces_connection = True  # stream_batches() yields [] once it holds a connection

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        client: httpx.AsyncClient | None = None,
        http: HTTPPath = "auto",
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_event_bytes: int = StreamLimits.max_event_bytes,
        max_connections: int = 100,
        pool_timeout: float | None = None,
    ) -> None:
        check_base_url(base_url)
        self.defaults = sampling_defaults(temperature, max_tokens)
        self.max_event_bytes = StreamLimits(max_event_bytes=max_event_bytes).max_event_bytes
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if key is None and "api.openai.com" in base_url:
            raise ConfigError(
                "provider.api_key: OpenAI needs an API key "
                "(set AI_LEASE_PROVIDER__API_KEY or OPENAI_API_KEY)"
            )
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or (max_connections < 1)
        ):
            raise ConfigError(f"provider.max_connections: {max_connections!r} is not a count >= 1")
        self.model = model
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._shown_url = mask_url(self._url)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        # Event streams are not worth compressing: identity is asked for (a server that
        # compresses anyway is decoded by the HTTP library, its output still bounded).
        self._stream_headers = {**self._post_headers(), "Accept-Encoding": "identity"}
        self.max_connections = max_connections
        self.pool_timeout = connect_timeout if pool_timeout is None else pool_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=self.pool_timeout),
            limits=httpx.Limits(max_connections=max_connections),
        )
        self._http = _http_path(http, client)
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._session: aiohttp.ClientSession | None = None  # made in the loop that uses it

    @property
    def http(self) -> str:
        """The HTTP path streams take: ``"aiohttp"`` or ``"httpx"``."""
        return self._http

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatProvider(url={self._url!r}, model={self.model!r}, http={self.http!r})"

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self.stream_batches(request)) as batches:
            async for batch in batches:
                for delta in batch:
                    yield delta

    async def stream_batches(self, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
        """The deltas of each network read together (see :class:`~.base.BatchStreaming`)."""
        body = orjson.dumps(request_body(request, self.model, stream=True, defaults=self.defaults))
        chunks, events, finished = 0, 0, False
        loads = orjson.loads
        open_stream = self._open_aiohttp if self._http == "aiohttp" else self._open_httpx
        try:
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(self._connection_slot())
                yield []  # a connection is ours: the guard's first-token clock starts here
                body_bytes = await stack.enter_async_context(open_stream(body))
                parser = _sse_batches(body_bytes, self.max_event_bytes)
                async with contextlib.aclosing(parser) as reader:
                    async for batch in reader:
                        events += len(batch)
                        out: list[Delta] = []
                        try:
                            for data in batch:
                                if data == b"[DONE]":
                                    if out:
                                        yield out
                                    if not finished:
                                        raise StreamInterrupted(
                                            "[DONE] came", provider=self.name, chunks=chunks
                                        )
                                    return
                                # Fast path, once per streamed token: one choice, text only.
                                try:
                                    obj = loads(data)
                                    choice = obj["choices"][0]
                                    text = choice["delta"]["content"]
                                    fast = (
                                        text.__class__ is str
                                        and text
                                        and choice["finish_reason"] is None
                                        and obj.get("usage") is None
                                    )
                                except (ValueError, LookupError, TypeError, AttributeError):
                                    obj, fast = None, False
                                if fast:
                                    chunks += 1
                                    out.append(Delta(text))
                                    continue
                                for delta in self._deltas(data, chunks, obj):
                                    chunks += bool(delta.text)
                                    finished = finished or delta.finish_reason is not None
                                    out.append(delta)
                        except ProviderError:
                            if out:  # what arrived before the bad chunk is still delivered
                                yield out
                            raise
                        if out:
                            yield out
                if not events:
                    raise EmptyEventStream(provider=self.name)
                raise self._error("the stream ended before [DONE]", chunks)
        except _EventTooLarge as exc:
            raise StreamLimitExceeded(
                "max_event_bytes", exc.limit, provider=self.name, chunks=chunks
            ) from None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise self._error(f"{type(exc).__name__}: {exc}", chunks) from exc

    @contextlib.asynccontextmanager
    async def _connection_slot(self) -> AsyncGenerator[None, None]:
        """One of ``max_connections``, waited for at most ``pool_timeout``."""
        try:
            async with asyncio.timeout(self.pool_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise PoolTimeout(self.pool_timeout, self.max_connections, provider=self.name) from None
        try:
            yield
        finally:
            self._slots.release()

    @contextlib.asynccontextmanager
    async def _open_httpx(self, body: bytes) -> AsyncGenerator[AsyncIterator[bytes], None]:
        """The event stream's bytes through httpx, after its status and type are checked."""
        async with self._client.stream(
            "POST", self._url, content=body, headers=self._stream_headers
        ) as response:
            await self._check(
                response.status_code, response.headers, "text/event-stream", response.aread
            )
            # Raw bytes: identity was asked for, so there is nothing to decode; a server
            # that compresses anyway goes through httpx's decoders.
            raw = response.aiter_raw() if _identity(response.headers) else response.aiter_bytes()
            async with contextlib.aclosing(raw) as chunks:  # type: ignore[type-var]
                yield chunks

    @contextlib.asynccontextmanager
    async def _open_aiohttp(self, body: bytes) -> AsyncGenerator[AsyncIterator[bytes], None]:
        """The same through aiohttp: whatever each network read brought, decoded."""
        async with self._aiohttp().post(
            self._url, data=body, headers=self._stream_headers, allow_redirects=False
        ) as response:
            # The exchange in one line, as httpx logs its own (never a header, so never a key)
            log.debug(
                "HTTP Request: POST %s %d %s", self._shown_url, response.status, response.reason
            )
            await self._check(
                response.status,
                response.headers,
                "text/event-stream",
                lambda: _head_of(response.content, _ERROR_BODY),
            )
            yield response.content.iter_any()

    def _aiohttp(self) -> aiohttp.ClientSession:
        """The provider's one session, made on first use inside the running loop."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                trust_env=True,  # HTTP(S)_PROXY / NO_PROXY, as httpx does
            )
        return self._session

    async def complete(self, request: ChatRequest) -> Completion:
        body = orjson.dumps(request_body(request, self.model, stream=False))
        try:
            response = await self._client.post(
                self._url, content=body, headers=self._post_headers()
            )
            await self._check(
                response.status_code, response.headers, "application/json", response.aread
            )
        except httpx.HTTPError as exc:
            raise self._error(f"{type(exc).__name__}: {exc}", 0) from exc
        try:
            data = orjson.loads(response.content)
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            usage = _usage(data.get("usage"))
            if not isinstance(text, str):
                raise TypeError(text)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise self._error(f"not a chat completion: {response.text[:80]!r}", 0) from None
        self._refuse_filtered(choice.get("finish_reason"))
        return Completion(text, choice.get("finish_reason"), usage)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_client:
            await self._client.aclose()

    # -- helpers --------------------------------------------------------------------------------

    def _post_headers(self) -> dict[str, str]:
        return {**self._headers, "Content-Type": "application/json"}

    async def _check(
        self,
        status: int,
        headers: Mapping[str, str],
        expect: str,
        read_body: Callable[[], Awaitable[bytes]],
    ) -> None:
        """Refuse an answer that is not a success of the ``expect``-ed content type; the
        body (read only then) gives the error its message. A 3xx is refused too: it is a
        wrong ``base_url``, which no retry mends."""
        kind = headers.get("content-type", "")
        if status < 300 and expect in kind:
            return
        content = await read_body()
        if status >= 300:
            raise status_error(self.name, status, content, headers)
        raise self._error(
            f"expected {expect}, got {kind or 'no content type'}: {content[:80]!r}", 0
        )

    def _deltas(self, data: bytes, chunks: int, obj: Any = None) -> list[Delta]:
        """Every delta of one chunk (the slow path); ``obj`` is the chunk already parsed."""
        try:
            if obj is None:
                obj = orjson.loads(data)
            if "error" in obj:
                raise self._error(f"error in stream: {obj['error']}", chunks)
            out = []
            for choice in obj.get("choices") or ():
                content = (choice.get("delta") or {}).get("content") or ""
                if not isinstance(content, str):
                    raise TypeError(content)
                finish = choice.get("finish_reason")
                self._refuse_filtered(finish)
                if content or finish:
                    out.append(Delta(content, finish))
            usage = obj.get("usage")
            if usage:
                out.append(Delta(usage=_usage(usage)))
            return out
        except (ValueError, AttributeError, TypeError):  # JSONDecodeError is a ValueError
            raise self._error(f"malformed chunk: {data[:80]!r}", chunks) from None

    def _refuse_filtered(self, finish: str | None) -> None:
        if finish == "content_filter":
            raise ProviderError(
                "the answer was stopped by the content filter", retryable=False, provider=self.name
            )

    def _error(self, message: str, chunks: int) -> ProviderError:
        return ProviderError(message, retryable=True, provider=self.name, partial=chunks > 0)


class _EventTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        self.limit = limit


async def _sse_batches(
    chunks: AsyncIterator[bytes], max_event_bytes: int = StreamLimits.max_event_bytes
) -> AsyncGenerator[list[bytes], None]:
    """Per network read, the ``data:`` payloads of the events it completed; comments skipped.

    A small bytes-level parser (measured against httpx-sse in docs/benchmarks.md): events end
    at a blank line; an event that is one ``data: …`` line — what chat servers send — takes a
    fast path; anything else (comments, several data lines, ``\r\n`` line ends, other
    fields) is parsed line by line per the SSE spec. ``event``/``id``/``retry`` are ignored.

    Linear in the bytes received, whatever their shape: each read is searched once (plus the
    one byte before it) for an event's end; the unfinished event's pieces are kept in a list
    and joined only when it ends; an event longer than ``max_event_bytes`` raises.
    """
    pending: list[bytes] = []  # the unfinished event, in pieces (no blank line among them)
    size = 0
    last = b""  # the last byte seen: half of a "\n\n" split across two reads
    for_later_cr = False  # a read ended in "\r", which may be half of a "\r\n"
    async for raw in chunks:
        if for_later_cr:
            raw = b"\r" + raw
            for_later_cr = False
        if b"\r" in raw:
            if raw.endswith(b"\r"):
                raw, for_later_cr = raw[:-1], True
            raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if not raw:
            continue
        if b"\n\n" not in raw and not (last == b"\n" and raw[:1] == b"\n"):
            pending.append(raw)
            size += len(raw)
            last = raw[-1:]
            if size > max_event_bytes:
                raise _EventTooLarge(max_event_bytes)
            continue
        buffer = b"".join(pending) + raw if pending else raw
        last = raw[-1:]
        *events, tail = buffer.split(b"\n\n")
        pending, size = ([tail], len(tail)) if tail else ([], 0)
        if size > max_event_bytes:
            raise _EventTooLarge(max_event_bytes)
        batch = []
        for event in events:
            if len(event) > max_event_bytes:
                raise _EventTooLarge(max_event_bytes)
            if event[:6] == b"data: " and b"\n" not in event:
                batch.append(event[6:])
            elif payload := _slow_event(event):
                batch.append(payload)
        if batch:
            yield batch
    if for_later_cr:
        pending.append(b"\n")
    if last_event := _slow_event(b"".join(pending)):
        yield [last_event]


async def _head_of(content: aiohttp.StreamReader, limit: int) -> bytes:
    """At most ``limit`` bytes of a body (an error answer's message), however it arrives."""
    parts, size = [], 0
    while size < limit and (piece := await content.read(limit - size)):
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def _identity(headers: Mapping[str, str]) -> bool:
    return headers.get("content-encoding", "identity").strip().lower() in ("", "identity")


def _http_path(http: str, client: httpx.AsyncClient | None) -> str:
    """``"aiohttp"`` or ``"httpx"``, from the ``http`` setting (``"fast"`` = ``"aiohttp"``)."""
    if http not in ("auto", "aiohttp", "httpx", "fast"):
        raise ConfigError(
            f"provider.http: {http!r} is not one of auto, aiohttp, httpx "
            '("fast" is accepted as the old name of aiohttp)'
        )
    if http == "auto":
        return "httpx" if client is not None else "aiohttp"
    return "httpx" if http == "httpx" else "aiohttp"


def _slow_event(event: bytes) -> bytes | None:
    data = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None
