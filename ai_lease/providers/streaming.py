"""What every lean streaming adapter shares: connections, the two HTTP paths, one loop.

An adapter is a wire format on top of :class:`HTTPStreamProvider`: it says where a request
goes and with which body and headers (:meth:`~HTTPStreamProvider.stream_request`), how
the body is framed into payloads (``framer``: server-sent events, or JSON lines), and how
payloads become deltas (:meth:`~HTTPStreamProvider.parser`, a :class:`StreamParser`).
The base class owns the rest, the same for every format:

- at most ``max_connections`` streams at once; one that finds them busy waits at most
  ``pool_timeout`` and fails with :class:`PoolTimeout` (the first, empty batch says
  "connection held": the stream guard starts its first-token clock there);
- the HTTP path (aiohttp's llhttp, or httpx), its connect and read timeouts, and the check
  of the answer's status and content type;
- one async generator from the socket to the guard: each network read is framed and
  parsed in plain calls, and only a read that brought deltas is yielded;
- an event longer than ``max_event_bytes`` closes the connection with
  :class:`StreamLimitExceeded`; a body that ends before the format's end marker is the
  parser's :meth:`~StreamParser.cut` error, never a short success (a format whose end
  marker is the body's end says so with an optional ``body_ended()``, see the protocol).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Protocol, TypedDict, Unpack
from urllib.parse import urlsplit

import aiohttp
import httpx

from ai_lease.errors import ConfigError, PoolTimeout, ProviderError, StreamLimitExceeded
from ai_lease.job import sampling_problem
from ai_lease.providers.base import ChatRequest, Delta
from ai_lease.providers.chunks import stream_error
from ai_lease.providers.errors import describe_sent
from ai_lease.providers.headers import extra_headers, with_extra
from ai_lease.providers.http_paths import (
    Read,
    aiohttp_reads,
    check_answer,
    http_path,
    httpx_reads,
    new_session,
)
from ai_lease.providers.sse import EventTooLarge, SSEFramer
from ai_lease.redaction import mask_url
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import StreamLimits

__all__ = [
    "Framer",
    "HTTPStreamProvider",
    "StreamOptions",
    "StreamParser",
    "check_base_url",
    "connection_count",
    "model_of",
    "sampling_defaults",
    "sampling_fields",
]


class Framer(Protocol):
    """Bytes in, payloads out: ``feed`` per network read, ``close`` at the body's end.
    Raises :class:`~ai_lease.providers.sse.EventTooLarge` past its limit."""

    def feed(self, raw: bytes) -> list[bytes]: ...

    def close(self) -> list[bytes]: ...


class StreamParser(Protocol):
    """One stream's payloads to deltas, keeping the counts its errors need."""

    chunks: int  # payloads that brought visible text (``partial`` of an error)
    events: int  # payloads seen
    stopped: bool  # the end marker (or an error) came: nothing more is read

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's payloads, up to the end marker or an error payload."""
        ...

    def end(self) -> None:
        """Once stopped: raise the error that stopped it, if any; nothing for a whole answer."""
        ...

    def cut(self) -> ProviderError:
        """The error for a body that ended before the end marker."""
        ...

    # Optional: ``body_ended()``, called once when the body ends, for a format with no end
    # sentinel (Gemini): it sets ``stopped`` when what came makes a whole answer.


class StreamOptions(TypedDict, total=False):
    """How a lean adapter connects (each optional): ``connect_timeout`` (10 s) and
    ``read_timeout`` (600 s: no byte for that long fails the stream), ``client`` (an httpx
    client of the caller's, which means the httpx path), ``http`` (``"auto"``, ``"aiohttp"``,
    ``"httpx"``), ``max_event_bytes``, ``max_connections`` (100), ``pool_timeout`` (the
    connect timeout: how long a stream waits for a free connection) and ``headers`` (extra
    request headers over the adapter's own; one set to ``""`` is not sent:
    :mod:`ai_lease.providers.headers`)."""

    connect_timeout: float
    read_timeout: float
    client: httpx.AsyncClient | None
    http: str
    max_event_bytes: int
    max_connections: int
    pool_timeout: float | None
    headers: Mapping[str, str] | None


class HTTPStreamProvider(AsyncResource, abc.ABC):
    """The shared half of a lean streaming adapter (see the module's docstring)."""

    name = "http-stream"
    announces_connection = True  # stream_batches() yields [] once it holds a connection
    framer: Callable[[int], Framer] = SSEFramer  # the body's framing, one per stream
    content_type = "text/event-stream"  # what a streamed answer must be
    sends_client_id = False  # X-Client-Request-Id too: the OpenAI paths document it

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        """``base_url`` checked; ``temperature`` / ``max_tokens`` the defaults of requests
        that set none; ``options`` the connection's (:class:`StreamOptions`)."""
        check_base_url(base_url)
        self.base_url = base_url.rstrip("/")  # what it calls: [limits] may name it
        self.model = model
        self.defaults = sampling_defaults(temperature, max_tokens)
        self._headers: dict[str, str] = {}  # every request's (the key's): set by the adapter
        self._extra = extra_headers(options.get("headers"))  # the user's, applied last
        connect_timeout = options.get("connect_timeout", 10.0)
        read_timeout = options.get("read_timeout", 600.0)
        client = options.get("client")
        max_connections = connection_count(options.get("max_connections", 100))
        pool_timeout = options.get("pool_timeout")
        limit = options.get("max_event_bytes", StreamLimits.max_event_bytes)
        self.max_event_bytes = StreamLimits(max_event_bytes=limit).max_event_bytes
        self.max_connections = max_connections
        self.pool_timeout = connect_timeout if pool_timeout is None else pool_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout, pool=self.pool_timeout),
            limits=httpx.Limits(max_connections=max_connections),
        )
        self._http = http_path(options.get("http", "auto"), client)
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._session: aiohttp.ClientSession | None = None  # made in the loop that uses it

    def _post_headers(self, request: ChatRequest) -> dict[str, str]:
        """A JSON request's headers: the adapter's, the request's tracing ones."""
        return {**self._request_headers(request), "Content-Type": "application/json"}

    def _request_headers(self, request: ChatRequest) -> dict[str, str]:
        """The adapter's headers (the key's) and the request's tracing ones."""
        return {**self._headers, **request.headers(client_id=self.sends_client_id)}

    async def post_json(self, url: str, body: bytes, request: ChatRequest) -> bytes:
        """A request not streamed: POST ``body`` and return the JSON answer's bytes; a
        non-2xx answer or one that is not JSON is the provider's error, as a stream's is. The
        stage's hard deadline bounds it from outside."""
        try:
            headers = with_extra(self._post_headers(request), self._extra)
            response = await self._client.post(url, content=body, headers=headers)
            await check_answer(
                self.name,
                response.status_code,
                response.headers,
                "application/json",
                response.aread,
                lambda: describe_sent("POST", headers, body),
            )
        except httpx.HTTPError as exc:
            raise stream_error(self.name, f"{type(exc).__name__}: {exc}", 0) from exc
        return response.content

    @property
    def http(self) -> str:
        """The HTTP path streams take: ``"aiohttp"`` or ``"httpx"``."""
        return self._http

    # -- what an adapter says ------------------------------------------------------

    @abc.abstractmethod
    def stream_request(self, request: ChatRequest) -> tuple[str, bytes | None, dict[str, str]]:
        """``(url, body, headers)`` of ``request`` streamed (a body of None: a GET)."""

    @abc.abstractmethod
    def parser(self) -> StreamParser:
        """A fresh parser for one stream."""

    # -- the loop --------------------------------------------------------------------

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self.stream_batches(request)) as batches:
            async for batch in batches:
                for delta in batch:
                    yield delta

    def stream_batches(self, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
        """The deltas of each network read together (see :class:`~.base.BatchStreaming`)."""
        return self.read_stream(request, self.parser())

    async def read_stream(
        self, request: ChatRequest, parser: StreamParser
    ) -> AsyncGenerator[list[Delta], None]:
        """:meth:`stream_batches` with a ``parser`` an adapter made for this very stream."""
        url, body, headers = self.stream_request(request)
        try:
            async with self._connection_slot():
                yield []  # a connection is ours: the guard's first-token clock starts here
                async with self._open(url, body, headers) as read:
                    framer = self.framer(self.max_event_bytes)
                    feed, deltas = framer.feed, parser.deltas
                    while raw := await read():
                        if (payloads := feed(raw)) and (out := deltas(payloads)):
                            yield out  # what came before a bad payload is still delivered
                        if parser.stopped:
                            parser.end()
                            return
                    if (payloads := framer.close()) and (out := deltas(payloads)):
                        yield out
                    if (body_ended := getattr(parser, "body_ended", None)) is not None:
                        body_ended()  # the body's end: Gemini's end marker; after a finish, whole
                    if parser.stopped:
                        parser.end()
                        return
                raise parser.cut()
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

    def _open(
        self, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> contextlib.AbstractAsyncContextManager[Read]:
        """The streamed body's reads on this provider's HTTP path. Event streams are not
        worth compressing: identity is asked for (a server that compresses anyway is
        decoded by the HTTP library, its output still bounded)."""
        headers = with_extra({**headers, "Accept-Encoding": "identity"}, self._extra)
        if self._http == "aiohttp":
            return aiohttp_reads(
                self.name,
                self._aiohttp(),
                url,
                body,
                headers,
                mask_url(url),
                self._read_timeout,
                expect=self.content_type,
            )
        return httpx_reads(self.name, self._client, url, body, headers, expect=self.content_type)

    def _aiohttp(self) -> aiohttp.ClientSession:
        """The provider's one session, made on first use inside the running loop."""
        if self._session is None:
            self._session = new_session(self.max_connections, self._connect_timeout)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._own_client:
            await self._client.aclose()


def connection_count(max_connections: object) -> int:
    """``max_connections`` if it is a count >= 1, else a :class:`ConfigError`."""
    if isinstance(max_connections, bool) or not isinstance(max_connections, int):
        raise ConfigError(f"provider.max_connections: {max_connections!r} is not a count >= 1")
    if max_connections < 1:
        raise ConfigError(f"provider.max_connections: {max_connections!r} is not a count >= 1")
    return max_connections


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


def model_of(request: ChatRequest, default_model: str | None) -> str:
    """The model a request names, else the provider's; a :class:`ConfigError` for none."""
    model = request.model or default_model
    if not model:
        raise ConfigError("provider.model: no model given (set it in the job or the settings)")
    return model


def sampling_fields(
    request: ChatRequest, defaults: Mapping[str, Any] | None, max_tokens_field: str = "max_tokens"
) -> dict[str, Any]:
    """The request's temperature and token limit (else the provider's defaults), only those
    set, under the names a wire format gives them (``max_output_tokens``, ``num_predict``…)."""
    defaults = defaults or {}
    temperature = request.temperature
    max_tokens = request.max_tokens
    if temperature is None:
        temperature = defaults.get("temperature")
    if max_tokens is None:
        max_tokens = defaults.get("max_tokens")
    out: dict[str, Any] = {}
    if temperature is not None:
        out["temperature"] = temperature
    if max_tokens is not None:
        out[max_tokens_field] = max_tokens
    return out
