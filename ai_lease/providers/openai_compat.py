"""``openai-compatible``: a lean streaming client for any OpenAI-compatible server.

OpenAI itself, vLLM, Ollama, llama.cpp's server, LM Studio… anything that speaks
``POST {base_url}/chat/completions`` with server-sent events. It exists beside the official
SDK adapter for speed: with streams paced as models send them (one event per write) it
spends about a quarter to a third of the SDK's CPU per event, which decides how many streams
one process can hold (figures in docs/benchmarks.md).

Two HTTP paths, one parser: ``http="aiohttp"`` streams through aiohttp (its llhttp parser
in C: TLS, proxies from the environment, decompression, keep-alive and connect timeouts
are aiohttp's; the read timeout is one lazy timer per stream, not one re-armed per read);
``http="httpx"`` streams through httpx. ``"auto"`` (the default)
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

The pieces: :mod:`~ai_lease.providers.http_paths` (the two HTTP paths, each a ``read()`` per
network read), :mod:`~ai_lease.providers.sse` (the bounded framer) and
:mod:`~ai_lease.providers.chunks` (chunk payloads to deltas); this module puts them together
in one async generator, so nothing else is resumed per event between the socket and the
stream guard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
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
    StreamLimitExceeded,
)
from ai_lease.job import sampling_problem
from ai_lease.lease.urls import mask_url
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.providers.chunks import ChunkParser, refuse_filtered, stream_error, usage_of
from ai_lease.providers.http_paths import (
    Read,
    aiohttp_reads,
    check_answer,
    http_path,
    httpx_reads,
    new_session,
)
from ai_lease.providers.sse import EventTooLarge, SSEFramer
from ai_lease.providers.sse import sse_batches as _sse_batches  # noqa: F401  (tests use it)
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import StreamLimits

HTTPPath = Literal["auto", "aiohttp", "httpx", "fast"]  # "fast": the old name of "aiohttp"

__all__ = ["OpenAICompatProvider", "check_base_url", "request_body", "sampling_defaults"]


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


class OpenAICompatProvider(AsyncResource):
    """Streams chat completions from ``base_url`` (default OpenAI's) with aiohttp or httpx.

    >>> provider = OpenAICompatProvider(base_url="http://127.0.0.1:8000/v1", model="qwen2.5")
    """

    name = "openai-compatible"
    announces_connection = True  # stream_batches() yields [] once it holds a connection
    framer: Callable[[int], SSEFramer] = SSEFramer  # the SSE framing, per stream

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
        key = _api_key(api_key, base_url)
        self.model = model
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._shown_url = mask_url(self._url)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        # Event streams are not worth compressing: identity is asked for (a server that
        # compresses anyway is decoded by the HTTP library, its output still bounded).
        self._stream_headers = {**self._post_headers(), "Accept-Encoding": "identity"}
        self.max_connections = _connection_count(max_connections)
        self.pool_timeout = connect_timeout if pool_timeout is None else pool_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=self.pool_timeout),
            limits=httpx.Limits(max_connections=max_connections),
        )
        self._http = http_path(http, client)
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
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
        """The deltas of each network read together (see :class:`~.base.BatchStreaming`).

        One generator between the socket and the guard: each ``read()`` is framed and
        parsed in plain calls, and only a read that brought content is yielded."""
        body = orjson.dumps(request_body(request, self.model, stream=True, defaults=self.defaults))
        parser = ChunkParser(self.name)
        try:
            async with self._connection_slot():
                yield []  # a connection is ours: the guard's first-token clock starts here
                async with self._open(body) as read:
                    framer = self.framer(self.max_event_bytes)
                    feed, deltas = framer.feed, parser.deltas
                    while raw := await read():
                        if (payloads := feed(raw)) and (out := deltas(payloads)):
                            yield out  # what came before a bad chunk is still delivered
                        if parser.stopped:
                            parser.end()
                            return
                    if (payloads := framer.close()) and (out := deltas(payloads)):
                        yield out
                    if parser.stopped:
                        parser.end()
                        return
                if not parser.events:
                    raise EmptyEventStream(provider=self.name)
                raise stream_error(self.name, "the stream ended before [DONE]", parser.chunks)
        except EventTooLarge as exc:
            raise StreamLimitExceeded(
                "max_event_bytes", exc.limit, provider=self.name, chunks=parser.chunks
            ) from None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise stream_error(self.name, f"{type(exc).__name__}: {exc}", parser.chunks) from exc

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

    def _open(self, body: bytes) -> contextlib.AbstractAsyncContextManager[Read]:
        """The event stream's reads on this provider's HTTP path."""
        return self._open_aiohttp(body) if self._http == "aiohttp" else self._open_httpx(body)

    def _open_httpx(self, body: bytes) -> contextlib.AbstractAsyncContextManager[Read]:
        return httpx_reads(self.name, self._client, self._url, body, self._stream_headers)

    def _open_aiohttp(self, body: bytes) -> contextlib.AbstractAsyncContextManager[Read]:
        session = self._aiohttp()
        return aiohttp_reads(
            self.name,
            session,
            self._url,
            body,
            self._stream_headers,
            self._shown_url,
            self._read_timeout,
        )

    def _aiohttp(self) -> aiohttp.ClientSession:
        """The provider's one session, made on first use inside the running loop."""
        if self._session is None:
            self._session = new_session(self.max_connections, self._connect_timeout)
        return self._session

    async def complete(self, request: ChatRequest) -> Completion:
        body = orjson.dumps(request_body(request, self.model, stream=False))
        try:
            response = await self._client.post(
                self._url, content=body, headers=self._post_headers()
            )
            await check_answer(
                self.name,
                response.status_code,
                response.headers,
                "application/json",
                response.aread,
            )
        except httpx.HTTPError as exc:
            raise stream_error(self.name, f"{type(exc).__name__}: {exc}", 0) from exc
        try:
            data = orjson.loads(response.content)
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            usage = usage_of(data.get("usage"))
            if not isinstance(text, str):
                raise TypeError(text)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            message = f"not a chat completion: {response.text[:80]!r}"
            raise stream_error(self.name, message, 0) from None
        refuse_filtered(self.name, choice.get("finish_reason"))
        return Completion(text, choice.get("finish_reason"), usage)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_client:
            await self._client.aclose()

    def _post_headers(self) -> dict[str, str]:
        return {**self._headers, "Content-Type": "application/json"}


def _api_key(api_key: str | SecretStr | None, base_url: str) -> str | None:
    """The key as text; OpenAI itself needs one (a local server does not)."""
    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if key is None and "api.openai.com" in base_url:
        raise ConfigError(
            "provider.api_key: OpenAI needs an API key "
            "(set AI_LEASE_PROVIDER__API_KEY or OPENAI_API_KEY)"
        )
    return key


def _connection_count(max_connections: object) -> int:
    if isinstance(max_connections, bool) or not isinstance(max_connections, int):
        raise ConfigError(f"provider.max_connections: {max_connections!r} is not a count >= 1")
    if max_connections < 1:
        raise ConfigError(f"provider.max_connections: {max_connections!r} is not a count >= 1")
    return max_connections
