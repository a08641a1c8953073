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
that is not streamed always goes through httpx.

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

The pieces: :mod:`~ai_lease.providers.streaming` (connections, the two HTTP paths, and the
one async generator between the socket and the stream guard, shared by every lean adapter),
:mod:`~ai_lease.providers.sse` (the bounded framer) and :mod:`~ai_lease.providers.chunks`
(chunk payloads to deltas); this module says only what is OpenAI's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Unpack

import orjson
from pydantic import SecretStr

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest, Completion, ToolCall
from ai_lease.providers.chunks import ChunkParser, refuse_filtered, stream_error, usage_of
from ai_lease.providers.sse import SSEFramer
from ai_lease.providers.sse import sse_batches as _sse_batches  # noqa: F401  (tests use it)
from ai_lease.providers.streaming import (
    HTTPStreamProvider,
    StreamOptions,
    check_base_url,
    model_of,
    sampling_defaults,
    sampling_fields,
)

__all__ = [
    "OpenAICompatProvider",
    "check_base_url",
    "message_tool_calls",
    "request_body",
    "sampling_defaults",
    "tool_fields",
]


def request_body(
    request: ChatRequest,
    default_model: str | None,
    stream: bool,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a chat completion request; ``defaults`` (the provider's configured
    ``temperature`` / ``max_tokens``) fill what the request leaves unset."""
    body: dict[str, Any] = {
        "model": model_of(request, default_model),
        "messages": [dict(m) for m in request.messages],
    }
    body.update(sampling_fields(request, defaults))
    if request.stop:
        body["stop"] = list(request.stop)
    body.update(tool_fields(request))
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(request.extra)
    return body


def tool_fields(request: ChatRequest) -> dict[str, Any]:
    """The request's ``tools``, ``tool_choice`` and ``response_format``, as OpenAI takes them
    (only those set: a server that knows none of them sees the same body as before)."""
    out: dict[str, Any] = {}
    if request.tools:
        out["tools"] = [dict(tool) for tool in request.tools]
    if request.tool_choice is not None:
        choice = request.tool_choice
        out["tool_choice"] = choice if isinstance(choice, str) else dict(choice)
    if request.response_format is not None:
        out["response_format"] = dict(request.response_format)
    return out


def message_tool_calls(message: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    """The whole tool calls of a ``chat.completion`` message (``TypeError`` /
    ``KeyError`` for a list of the wrong shape: the caller says "not a chat completion")."""
    calls = message.get("tool_calls") or ()
    out = []
    for call in calls:
        function = call["function"]
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise TypeError(function)
        out.append(ToolCall(str(call.get("id") or ""), name, arguments))
    return tuple(out)


class OpenAICompatProvider(HTTPStreamProvider):
    """Streams chat completions from ``base_url`` (default OpenAI's) with aiohttp or httpx.

    >>> provider = OpenAICompatProvider(base_url="http://127.0.0.1:8000/v1", model="qwen2.5")
    """

    name = "openai-compatible"
    sends_client_id = True
    framer: Callable[[int], SSEFramer] = SSEFramer  # the SSE framing, per stream

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        super().__init__(
            base_url=base_url,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            **options,
        )
        key = _api_key(api_key, base_url)
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatProvider(url={self._url!r}, model={self.model!r}, http={self.http!r})"

    def stream_request(self, request: ChatRequest) -> tuple[str, bytes, dict[str, str]]:
        body = orjson.dumps(request_body(request, self.model, stream=True, defaults=self.defaults))
        return self._url, body, self._post_headers(request)

    def parser(self) -> ChunkParser:
        return ChunkParser(self.name)

    async def complete(self, request: ChatRequest) -> Completion:
        """One whole answer (not streamed): its text, usage and tool calls, if it made any."""
        body = orjson.dumps(request_body(request, self.model, stream=False, defaults=self.defaults))
        content = await self.post_json(self._url, body, request)
        try:
            data = orjson.loads(content)
            choice = data["choices"][0]
            message = choice["message"]
            text = message["content"] or ""
            usage = usage_of(data.get("usage"))
            calls = message_tool_calls(message)
            if not isinstance(text, str):
                raise TypeError(text)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            problem = f"not a chat completion: {content[:80]!r}"
            raise stream_error(self.name, problem, 0) from None
        refuse_filtered(self.name, choice.get("finish_reason"))
        return Completion(text, choice.get("finish_reason"), usage, tool_calls=calls)


def _api_key(api_key: str | SecretStr | None, base_url: str) -> str | None:
    """The key as text; OpenAI itself needs one (a local server does not)."""
    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if key is None and "api.openai.com" in base_url:
        raise ConfigError(
            "no API key for OpenAI: set OPENAI_API_KEY, or provider.api_key "
            "(AI_LEASE_PROVIDER__API_KEY)"
        )
    return key
