"""``ollama``: a lean client of Ollama's native ``POST /api/chat`` (JSON lines).

The answer streams as ``application/x-ndjson``, one JSON object per line::

    {"model": "qwen3", "created_at": "…", "message": {"role": "assistant", "content": "Hel"},
     "done": false}
    {"model": "qwen3", "created_at": "…", "message": {"role": "assistant", "content": ""},
     "done": true, "done_reason": "stop", "prompt_eval_count": 26, "eval_count": 298, …}

Progress is any non-empty ``message.content`` (the answer), ``message.thinking`` (a
thinking model's reasoning, never part of the answer) or ``message.tool_calls`` (Ollama
sends each call whole: one fragment with its name and its arguments as JSON text). A line
with empty content and ``done: false`` is liveness only. The end marker is ``done: true``:
``done_reason`` ``"stop"`` is a whole answer (``"tool_calls"`` when the model called tools),
``"length"`` an answer cut at ``num_predict``; ``"load"`` / ``"unload"`` (the server only
loaded or unloaded the model, as it does for a request without messages) is an error, not
an empty answer; any other reason is passed on as the finish reason, verbatim. Usage is
``prompt_eval_count`` / ``eval_count`` (thinking tokens included: Ollama does not count
them apart). A body that ends before ``done: true`` is an error, never a short answer.

**Model loading counts against the first-token budget.** Ollama loads a model on its first
request (and again after ``keep_alive`` unloads it) and sends nothing — not even the answer's
head — until the model is loaded and the first token is out; ``load_duration`` in the last
line says how long that took. Size ``stream.first_token`` for a cold load (or keep the model
loaded with ``keep_alive``), or a cold start is a :class:`FirstTokenTimeout`.

Failures: an ``{"error": "…"}`` line under HTTP 200 is a :class:`ProviderError`, retryable
before any visible text and ``partial`` after; an HTTP error carries Ollama's own
``{"error": "…"}`` message (404: the model is not pulled; 400: a bad request, neither
retried; 429 / 5xx — 503 is Ollama's "server busy" — retried).

The request is translated from the neutral OpenAI shapes: text parts are joined into the
message's content, ``image_url`` parts must be ``data:`` URLs (Ollama takes inline base64
images only; an http(s) image URL is a :class:`ConfigError`, it is never fetched here);
``tools`` go as they are (Ollama reads OpenAI's tool shape); an assistant message's tool
calls get their arguments as objects; ``response_format`` ``json_schema`` becomes
``format: <schema>`` and ``json_object`` ``format: "json"``. Ollama cannot force a tool
call: ``tool_choice`` ``"auto"`` is the default, ``"none"`` leaves the tools out, and
``"required"`` or a named function is a :class:`ConfigError`. ``temperature`` and
``max_tokens`` go in ``options`` (``num_predict``), ``stop`` as ``options.stop``, a request's
``extra["options"]`` (``num_ctx``…) merged into them; ``think`` (if set: true, false, or
``"low"`` / ``"medium"`` / ``"high"``) as ``think``. An ``api_key`` is sent as a Bearer
token (for a proxy in front of Ollama; Ollama itself needs none).

Known traps: Ollama truncates a prompt longer than its context (``num_ctx``, a few thousand
tokens by default) silently — ``prompt_eval_count`` shows it; pass ``options.num_ctx``.
``OLLAMA_HOST=0.0.0.0`` is a server's bind address (:func:`ollama_base_url` dials loopback).
Before Ollama 0.8 (May 2025) a request with ``tools`` was not streamed token by token: the
answer came whole at the end, so ``first_token`` had to cover the whole generation.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any, Literal, Unpack
from urllib.parse import urlsplit

import orjson
from pydantic import SecretStr

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers.base import ChatRequest, Completion, Delta, ToolCall, ToolCallDelta, Usage
from ai_lease.providers.chunks import stream_error
from ai_lease.providers.ndjson import NDJSONFramer
from ai_lease.providers.ollama_request import chat_body
from ai_lease.providers.streaming import HTTPStreamProvider, StreamOptions

__all__ = ["DEFAULT_PORT", "OllamaParser", "OllamaProvider", "ollama_base_url"]

DEFAULT_PORT = 11434
_THINK_LEVELS = ("low", "medium", "high")  # what gpt-oss takes instead of true
_loads = orjson.loads


def ollama_base_url(value: str) -> str:
    """The base URL an ``OLLAMA_HOST`` value names, read as Ollama's own clients read it:
    quotes and spaces trimmed; no scheme means ``http`` and port 11434; ``http://`` /
    ``https://`` without a port mean 80 / 443; an empty value or host means 127.0.0.1; a
    path is kept. One difference: the address a server binds to every interface with
    (``0.0.0.0``, ``::``) is dialled as loopback, which works everywhere.

    >>> ollama_base_url("0.0.0.0"), ollama_base_url("gpu-box:8080")
    ('http://127.0.0.1:11434', 'http://gpu-box:8080')
    """
    text = value.strip().strip("\"'").strip()
    scheme, sep, hostport = text.partition("://")
    port = DEFAULT_PORT
    if not sep:
        scheme, hostport = "http", text
    elif scheme in ("http", "https"):
        port = 80 if scheme == "http" else 443
    else:
        raise ConfigError(f"OLLAMA_HOST: {value[:100]!r} has scheme {scheme!r}; use http or https")
    hostname, slash, rest = hostport.partition("/")
    if hostname.count(":") > 1 and not hostname.startswith("["):  # a bare IPv6 address
        hostport = f"[{hostname}]{slash}{rest}"
    try:
        parts = urlsplit(f"{scheme}://{hostport}")
        port = parts.port or port
    except ValueError:
        raise ConfigError(
            f"OLLAMA_HOST: {value[:100]!r} has no valid port; give host, host:port or a URL "
            "like http://127.0.0.1:11434"
        ) from None
    host = parts.hostname or "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if address.is_unspecified:
            address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
        host = f"[{address}]" if address.version == 6 else str(address)
    path = parts.path.strip("/")
    return f"{scheme}://{host}:{port}" + (f"/{path}" if path else "")


# -- the stream -------------------------------------------------------------------------


class OllamaParser:
    """The deltas of one ``/api/chat`` stream's lines, read by read."""

    __slots__ = ("calls", "chunks", "error", "events", "provider", "stopped")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.chunks = 0  # lines that brought visible text (``partial`` of an error)
        self.events = 0  # lines seen
        self.calls = 0  # tool calls seen: their index, and a "tool_calls" finish
        self.error: ProviderError | None = None
        self.stopped = False  # done: true, or an error: nothing more is read

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's lines, up to ``done: true`` or an error line."""
        self.events += len(payloads)
        out: list[Delta] = []
        for line in payloads:
            obj: Any = None
            # Fast path, once per streamed token: text only, not done.
            try:
                obj = _loads(line)
                message = obj["message"]
                text = message["content"]
                fast = text.__class__ is str and text and len(message) == 2 and not obj["done"]
            except (ValueError, LookupError, TypeError):
                fast = False
            if fast:
                self.chunks += 1
                out.append(Delta(text))
                continue
            try:
                delta = self._line(line, obj)
            except ProviderError as exc:
                self.error, self.stopped = exc, True
                return out
            if delta is not None:
                self.chunks += bool(delta.text)
                out.append(delta)
            if self.stopped:
                return out
        return out

    def end(self) -> None:
        """Once stopped: the error line's (or a bad line's) error; nothing after ``done``."""
        if self.error is not None:
            raise self.error

    def cut(self) -> ProviderError:
        """The body ended before a line with ``done: true``."""
        return stream_error(
            self.provider,
            f"the stream ended before a line with done: true ({self.events} lines received)",
            self.chunks,
        )

    def _line(self, line: bytes, obj: Any) -> Delta | None:
        """The delta of one line (the slow path), None for a line of liveness only."""
        if not isinstance(obj, dict):
            raise stream_error(self.provider, f"malformed line: {line[:80]!r}", self.chunks)
        if "error" in obj:
            raise stream_error(self.provider, f"error in stream: {obj['error']}", self.chunks)
        try:
            text, thinking, calls = message_parts(obj.get("message"), self.calls)
        except (TypeError, ValueError, LookupError, AttributeError):
            raise stream_error(
                self.provider, f"malformed line: {line[:80]!r}", self.chunks
            ) from None
        self.calls += len(calls)
        finish, usage = None, None
        if obj.get("done") is True:
            self.stopped = True
            finish = finish_reason(self.provider, obj.get("done_reason"), self.calls)
            usage = usage_of(obj)
        if text or thinking or calls or finish:
            return Delta(text, finish, usage, thinking, calls)
        return None


def message_parts(message: Any, first: int) -> tuple[str, str, tuple[ToolCallDelta, ...]]:
    """``(content, thinking, tool calls)`` of a line's ``message``; calls are numbered from
    ``first``, each one whole fragment (id synthesised when Ollama sends none)."""
    if message is None:
        return "", "", ()
    text = message.get("content") or ""
    thinking = message.get("thinking") or ""
    if not isinstance(text, str) or not isinstance(thinking, str):
        raise TypeError(text)
    calls = []
    for n, call in enumerate(message.get("tool_calls") or (), start=first):
        function = call["function"]
        arguments = function.get("arguments")
        args = arguments if isinstance(arguments, str) else orjson.dumps(arguments or {}).decode()
        calls.append(ToolCallDelta(n, call.get("id") or f"call_{n}", function["name"], args))
    return text, thinking, tuple(calls)


def finish_reason(provider: str, done_reason: Any, calls: int) -> str:
    """The finish reason of a ``done: true`` line (see the module's docstring)."""
    if done_reason in (None, "", "stop"):
        return "tool_calls" if calls else "stop"
    if done_reason in ("load", "unload"):
        raise ProviderError(
            f"Ollama only {done_reason}ed the model (done_reason {done_reason!r}) and sent no "
            "answer: the request had no messages to answer",
            retryable=False,
            provider=provider,
        )
    return str(done_reason)


def usage_of(obj: Mapping[str, Any]) -> Usage:
    """The token counts of a ``done: true`` line (a count Ollama left out is 0)."""
    return Usage(int(obj.get("prompt_eval_count") or 0), int(obj.get("eval_count") or 0))


class OllamaProvider(HTTPStreamProvider):
    """Streams ``/api/chat`` from an Ollama server with aiohttp or httpx.

    >>> provider = OllamaProvider(base_url="http://127.0.0.1:11434", model="qwen3:8b")
    """

    name = "ollama"
    framer: Callable[[int], NDJSONFramer] = NDJSONFramer
    content_type = "application/x-ndjson"

    def __init__(
        self,
        *,
        base_url: str = f"http://127.0.0.1:{DEFAULT_PORT}",
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        think: bool | Literal["low", "medium", "high"] | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        if "://" not in base_url:  # an OLLAMA_HOST-style "host:port"
            base_url = ollama_base_url(base_url)
        if think is not None and not isinstance(think, bool) and think not in _THINK_LEVELS:
            raise ConfigError(
                f"provider.think: {think!r} is not true, false, or one of low, medium, high"
            )
        super().__init__(
            base_url=base_url,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            **options,
        )
        self.think = think
        self._url = base_url.rstrip("/") + "/api/chat"
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    def __repr__(self) -> str:  # never shows the key
        return f"OllamaProvider(url={self._url!r}, model={self.model!r}, http={self.http!r})"

    def stream_request(self, request: ChatRequest) -> tuple[str, bytes, dict[str, str]]:
        return self._url, self._body(request, stream=True), self._post_headers(request)

    def parser(self) -> OllamaParser:
        return OllamaParser(self.name)

    async def complete(self, request: ChatRequest) -> Completion:
        """One answer, not streamed (``stream: false``: one JSON object)."""
        body = self._body(request, stream=False)
        content = await self.post_json(self._url, body, request)
        parser = self.parser()
        deltas = parser.deltas([content])
        parser.end()
        if not parser.stopped:
            raise stream_error(self.name, f"not a whole answer: {content[:80]!r}", 0)
        text = "".join(d.text for d in deltas)
        finish = next((d.finish_reason for d in deltas if d.finish_reason), None)
        usage = next((d.usage for d in deltas if d.usage), None)
        calls = tuple(
            ToolCall(c.id or "", c.name or "", c.arguments) for d in deltas for c in d.tool_calls
        )
        return Completion(text, finish, usage, parser.chunks, calls)

    def _body(self, request: ChatRequest, *, stream: bool) -> bytes:
        body = chat_body(request, self.model, stream=stream, defaults=self.defaults)
        if self.think is not None:
            body.setdefault("think", self.think)
        return orjson.dumps(body)
