"""``openai``: the official OpenAI SDK, for OpenAI and any OpenAI-compatible ``base_url``.

The SDK's own retries are off (``max_retries=0``): retry policy lives in one place, ai_lease's.
Measured traps of the SDK (3.x, on httpx2) that this adapter closes:

* it ends **without an error** on a stream cut before ``[DONE]`` and on a 200 with an HTML
  body — here a stream with no finish reason is a :class:`ProviderError`;
* its read timeout is reset by every SSE ``: ping`` comment, so a server that only pings
  never times out — the stream guard's first-token and idle timers do not see pings at all;
* its SSE decoder hands over an event with no ``data:`` (``retry: 3000`` alone), which the
  SDK then fails to decode as JSON — here such an event is not dispatched, as the SSE spec
  says; and it grows a line without bound — here one event may hold ``max_event_bytes``.
  Both through public API only: an httpx2 response hook on the SDK's ``http_client=``
  (:mod:`ai_lease.providers.sdk_events`); the SDK's private decoder is not touched.

A stream that ends (``[DONE]`` or the body's end) without a finish reason is
:class:`StreamInterrupted`; a 200 event stream with no events at all is
:class:`EmptyEventStream`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from typing import Any

import openai
from pydantic import SecretStr

from ai_lease.errors import (
    ConfigError,
    EmptyEventStream,
    ProviderError,
    StreamInterrupted,
    StreamLimitExceeded,
)
from ai_lease.providers.base import (
    ChatRequest,
    Completion,
    Delta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from ai_lease.providers.chunks import stream_error
from ai_lease.providers.errors import (
    RequestRefused,
    describe_sent,
    empty_answer,
    error_message,
    request_fault,
    retry_hint,
)
from ai_lease.providers.headers import extra_headers, with_extra
from ai_lease.providers.openai_compat import check_base_url, request_body, sampling_defaults
from ai_lease.providers.sdk_events import WATCH, EventWatch, watching_hook
from ai_lease.providers.sse import EventTooLarge
from ai_lease.resource import AsyncResource
from ai_lease.timeouts import StreamLimits

__all__ = ["OpenAISDKProvider"]

_TRANSPORT_MODULES = ("httpx", "httpx2", "httpcore", "httpcore2", "h11", "anyio")


class OpenAISDKProvider(AsyncResource):
    """Chat completions through ``openai.AsyncOpenAI``.

    >>> provider = OpenAISDKProvider(model="gpt-4o-mini", api_key="sk-…")  # doctest: +SKIP
    """

    name = "openai"

    def __init__(
        self,
        *,
        api_key: str | SecretStr | None = None,
        base_url: str | None = None,
        model: str | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 600.0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        max_event_bytes: int = StreamLimits.max_event_bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers``: extra request headers over the SDK's own, one set to ``""`` not sent
        (:mod:`ai_lease.providers.headers`)."""
        if base_url is not None:
            check_base_url(base_url)
        self._extra = extra_headers(headers)
        _check_drops(self._extra)
        self.defaults = sampling_defaults(temperature, max_tokens)
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if key is None and base_url is None:
            raise ConfigError(
                "no API key for OpenAI: set OPENAI_API_KEY, or provider.api_key "
                "(AI_LEASE_PROVIDER__API_KEY)"
            )
        self.model = model
        self._openai = openai
        self.max_event_bytes = StreamLimits(max_event_bytes=max_event_bytes).max_event_bytes
        hooks = {"response": [watching_hook(self.max_event_bytes)]}
        self._client = openai.AsyncOpenAI(
            api_key=key or "not-needed",
            base_url=base_url,
            max_retries=0,
            timeout=openai.Timeout(read_timeout, connect=connect_timeout),
            http_client=openai.DefaultAsyncHttpxClient(event_hooks=hooks),
        )

    def __repr__(self) -> str:
        return f"OpenAISDKProvider(base_url={self.base_url!r}, model={self.model!r})"

    @property
    def base_url(self) -> str:
        """What it calls ([limits] may name it): the SDK client's base URL."""
        return str(self._client.base_url).rstrip("/")

    def _auth_header_names(self) -> list[str]:
        """The names of the headers the SDK adds for its key at send time, past the request
        an error carries (openai 3.x signs in an auth flow), less those dropped on purpose."""
        dropped = {name.lower() for name, value in self._extra.items() if not value}
        names = getattr(self._client, "auth_headers", None) or {}
        return [name for name in names if name.lower() not in dropped]

    def _translate(self, exc: Exception, chunks: int) -> ProviderError:
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            retryable = status >= 500 or status in (408, 409, 425, 429)
            retry_after = retry_hint(status, exc.response.headers, exc.body)
            message = f"HTTP {status}: {_status_message(exc, self._auth_header_names())}"
            if chunks == 0 and request_fault(status, error_message({"error": exc.body})):
                return RequestRefused(message, provider=self.name, status=status)
            return ProviderError(
                message,
                retryable=retryable,
                provider=self.name,
                status=status,
                retry_after=retry_after,
                partial=chunks > 0,
            )
        return ProviderError(
            f"{type(exc).__name__}: {exc}", retryable=True, provider=self.name, partial=chunks > 0
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self.stream_batches(request)) as batches:
            async for batch in batches:
                for delta in batch:
                    yield delta

    async def stream_batches(self, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
        """The deltas of each SDK chunk together (see :class:`~.base.BatchStreaming`): the
        guard reads this directly, with no per-delta generator between it and the SDK."""
        body = _sdk_body(request, self.model, self.defaults, self._extra, stream=True)
        chunks, finished = 0, False
        stream: Any = None
        try:
            stream = await self._client.chat.completions.create(**body)
            try:
                async for chunk in stream:
                    deltas = self._deltas(chunk, chunks)
                    for delta in deltas:
                        finished = finished or delta.finish_reason is not None
                        chunks += bool(delta.text)
                    if deltas:
                        yield deltas
            finally:
                await stream.close()
        except self._openai.OpenAIError as exc:
            raise self._translate(exc, chunks) from exc
        except ProviderError:
            raise
        except EventTooLarge:
            raise StreamLimitExceeded(
                "max_event_bytes", self.max_event_bytes, provider=self.name, chunks=chunks
            ) from None
        except ValueError as exc:  # the SDK's own JSON decoding of a malformed chunk
            raise self._malformed(exc, chunks) from exc
        except Exception as exc:  # httpx2 transport errors surface unwrapped mid-stream
            if type(exc).__module__.split(".")[0] not in _TRANSPORT_MODULES:
                raise
            raise self._translate(exc, chunks) from exc
        if not finished:
            raise self._unfinished(stream, chunks)

    def _unfinished(self, stream: Any, chunks: int) -> ProviderError:
        """Why a stream that ended without a finish reason is not an answer."""
        response = stream.response if stream is not None else None
        kind = response.headers.get("content-type", "") if response is not None else ""
        watch = response.extensions.get(WATCH) if response is not None else None
        if isinstance(watch, EventWatch) and watch.events == 0 and "text/event-stream" in kind:
            return EmptyEventStream(provider=self.name)
        if "text/event-stream" not in kind:
            return ProviderError(
                f"expected text/event-stream, got {kind or 'no content type'}",
                retryable=True,
                provider=self.name,
            )
        if isinstance(watch, EventWatch) and watch.done:
            return StreamInterrupted("[DONE] came", provider=self.name, chunks=chunks)
        return ProviderError(  # cut: as the lean adapter says it
            "the stream ended before [DONE]",
            retryable=True,
            provider=self.name,
            partial=chunks > 0,
        )

    def _deltas(self, chunk: Any, chunks: int) -> list[Delta]:
        """The deltas of one SDK chunk object; the SDK does not validate chunks, so a
        chunk of the wrong shape is a malformed-chunk error here."""
        try:
            out = []
            for choice in chunk.choices[:1]:
                delta = choice.delta
                text = (delta.content if delta else None) or ""
                reasoning = _reasoning(delta)
                if not isinstance(text, str) or not isinstance(reasoning, str):
                    raise TypeError(f"content is {type(text).__name__}, not text")
                calls = _tool_calls(delta)
                if choice.finish_reason == "content_filter":
                    raise ProviderError(
                        "the answer was stopped by the content filter",
                        retryable=False,
                        provider=self.name,
                    )
                if text or choice.finish_reason or reasoning or calls:
                    out.append(Delta(text, choice.finish_reason, None, reasoning, calls))
            if chunk.usage is not None:
                out.append(Delta(usage=_usage(chunk.usage)))
            return out
        except (AttributeError, TypeError, ValueError) as exc:
            raise self._malformed(exc, chunks) from exc

    def _malformed(self, exc: Exception, chunks: int) -> ProviderError:
        return ProviderError(
            f"malformed chunk: {type(exc).__name__}: {exc}"[:300],
            retryable=True,
            provider=self.name,
            partial=chunks > 0,
        )

    async def complete(self, request: ChatRequest) -> Completion:
        """One whole answer (not streamed): its text, usage and tool calls, if it made any."""
        body = _sdk_body(request, self.model, self.defaults, self._extra, stream=False)
        try:
            answer: Any = await self._client.chat.completions.create(**body)
        except self._openai.OpenAIError as exc:
            raise self._translate(exc, 0) from exc
        except json.JSONDecodeError as exc:  # the SDK's json.loads of a malformed body
            raise _not_a_completion(self.name, exc) from exc
        choices = getattr(answer, "choices", None)
        if not choices:
            raise ProviderError(
                f"not a chat completion: {str(answer)[:80]!r}", retryable=True, provider=self.name
            )
        choice = choices[0]
        if choice.finish_reason == "content_filter":
            raise ProviderError(
                "the answer was stopped by the content filter", retryable=False, provider=self.name
            )
        try:
            calls = _whole_tool_calls(choice.message)
        except (AttributeError, TypeError) as exc:
            raise self._malformed(exc, 0) from exc
        usage = answer.usage
        return Completion(
            choice.message.content or "",
            choice.finish_reason,
            _usage(usage) if usage else None,
            tool_calls=calls,
        )

    async def aclose(self) -> None:
        await self._client.close()


def _sdk_body(
    request: ChatRequest,
    model: str | None,
    defaults: dict[str, Any],
    extra: Mapping[str, str],
    *,
    stream: bool,
) -> dict[str, Any]:
    """``chat.completions.create``'s arguments: the lean adapter's body (tools, tool choice
    and response format included), and as ``extra_headers`` the request's tracing headers
    with the user's ``extra`` over them (one set to ``""``: ``Omit()``, the SDK drops it,
    its own default headers included)."""
    body = request_body(request, model, stream=stream, defaults=defaults)
    headers: dict[str, Any] = {**with_extra(request.headers(client_id=True), extra)}
    omit = getattr(openai, "Omit", None)  # public in recent SDKs; older ones cannot drop
    if omit is not None:  # theirs anyway (refused by _check_drops), and ours are never added
        headers.update({name: omit() for name, value in extra.items() if not value})
    if headers:
        body["extra_headers"] = headers
    return body


def _not_a_completion(provider: str, exc: json.JSONDecodeError) -> ProviderError:
    """A 200 whose JSON body does not parse: retryable, with what came, in the lean paths'
    words (``not a chat completion: b'…'``)."""
    return stream_error(provider, f"not a chat completion: {exc.doc.encode()[:80]!r}", 0)


def _status_message(exc: openai.APIStatusError, auth_names: Iterable[str] = ()) -> str:
    """The SDK's message, or for an answer with an empty body what the request carried
    (``auth_names``: the key's headers, which the request object may not show)."""
    try:
        response = exc.response
        if response.content.strip():
            return exc.message
        request = response.request
        names = {name.lower(): name for name in [*auth_names, *request.headers.keys()]}
        sent = describe_sent(request.method, names.values(), request.content)
    except Exception:  # a body not read: the SDK's message is all there is
        return exc.message
    return empty_answer(sent)


def _usage(usage: Any) -> Usage:
    """The SDK's ``CompletionUsage``, reasoning tokens from ``completion_tokens_details``
    (an object in SDKs that know the field, a plain dict of extras in older ones)."""
    details = getattr(usage, "completion_tokens_details", None)
    if isinstance(details, dict):
        reasoning = details.get("reasoning_tokens")
    else:
        reasoning = getattr(details, "reasoning_tokens", None) if details is not None else None
    return Usage(
        int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0), int(reasoning or 0)
    )


def _whole_tool_calls(message: Any) -> tuple[ToolCall, ...]:
    """A whole message's tool calls (the SDK's ``ChatCompletionMessageToolCall`` objects)."""
    out = []
    for call in getattr(message, "tool_calls", None) or ():
        function = call.function
        name, arguments = function.name or "", function.arguments or ""
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise TypeError(f"tool-call arguments are {type(arguments).__name__}, not text")
        out.append(ToolCall(str(call.id or ""), name, arguments))
    return tuple(out)


def _reasoning(delta: Any) -> Any:
    """A delta's reasoning text: ``reasoning_content`` (DeepSeek, vLLM, llama.cpp) or
    ``reasoning``, extra fields the SDK keeps on its delta object."""
    if delta is None:
        return ""
    return getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None) or ""


def _tool_calls(delta: Any) -> tuple[ToolCallDelta, ...]:
    """A delta's tool-call fragments (the SDK's ``ChoiceDeltaToolCall`` objects)."""
    calls = getattr(delta, "tool_calls", None) if delta is not None else None
    if not calls:
        return ()
    out = []
    for call in calls:
        function = call.function
        arguments = (function.arguments if function else None) or ""
        if not isinstance(arguments, str):
            raise TypeError(f"tool-call arguments are {type(arguments).__name__}, not text")
        name = function.name if function else None
        out.append(ToolCallDelta(int(call.index or 0), call.id, name, arguments))
    return tuple(out)


# Our own ids are never added when dropped; the SDK's own headers (Authorization, its
# User-Agent …) are dropped with Omit, which openai honours in extra_headers from 3.20 on
# (3.15 still sent them: measured in the floor run).
_OWN_IDS = frozenset({"x-request-id", "x-client-request-id"})
_DROPS_FROM = (3, 20)


def _check_drops(extra: Mapping[str, str]) -> None:
    """Refuse, rather than silently send, a drop of the SDK's own header it cannot honour."""
    dropped = sorted(n for n, v in extra.items() if not v and n.lower() not in _OWN_IDS)
    if not dropped:
        return
    from importlib.metadata import version

    release = version("openai")
    installed = tuple(int(p) for p in release.split(".")[:2] if p.isdigit())
    if installed < _DROPS_FROM:
        raise ConfigError(
            f"provider.headers: the openai SDK {release} cannot drop its own "
            f"{', '.join(dropped)} header (openai >= 3.20 can); upgrade it, or use the "
            "openai-compatible adapter"
        )
