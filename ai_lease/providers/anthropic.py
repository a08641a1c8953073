"""``anthropic``: a lean streaming client of Anthropic's native Messages API.

``POST {base_url}/v1/messages`` (default ``https://api.anthropic.com``) with ``x-api-key``
and ``anthropic-version`` headers, streamed as server-sent events on the shared
:class:`~ai_lease.providers.streaming.HTTPStreamProvider` (aiohttp or httpx, the bounded
SSE framer); :mod:`~ai_lease.providers.anthropic_events` turns events into deltas. Thinking
and tool-argument fragments are progress; ``ping`` is liveness only; a body that ends
before ``message_stop`` is an error, never a short answer; an ``error`` event after the 200
(``overloaded_error``) is retryable before any answer content and is not re-made silently
after it; 429 and 529 honour ``retry-after``.

Requests come in OpenAI's neutral shapes (:class:`~ai_lease.providers.base.ChatRequest`)
and are translated: system messages become the top-level ``system``; text and image parts
become content blocks (an ``https:`` image URL a ``url`` source, a ``data:`` URL a
``base64`` one); an assistant's ``tool_calls`` become ``tool_use`` blocks and ``tool``
messages user ``tool_result`` blocks (consecutive messages of one role are merged, as the
API wants tool results together); ``tools`` become ``{name, description, input_schema}``;
``tool_choice`` ``auto`` / ``none`` / ``required`` (``any``) / a named function.
``max_tokens``, which Anthropic requires, is the request's, else the provider's, else
:data:`DEFAULT_MAX_TOKENS`; ``stop`` becomes ``stop_sequences``; ``extra`` is passed through
(e.g. ``thinking={"type": "enabled", "budget_tokens": 2048}``).

``response_format`` (JSON schema or JSON object): the Messages API has no such field, so
the schema becomes one forced tool, :data:`~.anthropic_events.JSON_TOOL`, whose input is
the answer; its arguments are delivered as the answer *text* and its stop as ``"stop"``,
so a ``json`` job reads the JSON text exactly as from OpenAI. It cannot be combined with
``tools`` (:class:`ConfigError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

import orjson
from pydantic import SecretStr

from ai_lease.errors import ConfigError
from ai_lease.providers.anthropic_events import (
    JSON_TOOL,
    MessageEventParser,
    finish_of,
    usage_of,
)
from ai_lease.providers.base import ChatRequest, Completion, ToolCall
from ai_lease.providers.chunks import stream_error
from ai_lease.providers.streaming import (
    HTTPStreamProvider,
    StreamOptions,
    model_of,
    sampling_fields,
)
from ai_lease.redaction import register_secret

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicProvider", "messages_body"]

DEFAULT_MAX_TOKENS = 4096
"""``max_tokens`` of a request that sets none (the API requires one)."""


class AnthropicProvider(HTTPStreamProvider):
    """Streams Anthropic Messages from ``base_url`` with aiohttp or httpx.

    >>> provider = AnthropicProvider(api_key="sk-ant-…", model="claude-sonnet-4-5")
    """

    name = "anthropic"

    def __init__(
        self,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        anthropic_version: str = "2023-06-01",
        **options: Unpack[StreamOptions],
    ) -> None:
        key = _api_key(api_key, base_url)
        super().__init__(
            base_url=base_url,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            **options,
        )
        register_secret(key)  # masked in every error text, even one a server echoes
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._headers = {"anthropic-version": anthropic_version}
        if key:
            self._headers["x-api-key"] = key

    def __repr__(self) -> str:  # never shows the key
        return f"AnthropicProvider(url={self._url!r}, model={self.model!r}, http={self.http!r})"

    def stream_request(self, request: ChatRequest) -> tuple[str, bytes, dict[str, str]]:
        body = messages_body(request, self.model, stream=True, defaults=self.defaults)
        return self._url, orjson.dumps(body), self._post_headers(request)

    def parser(self) -> MessageEventParser:
        return MessageEventParser(self.name)

    async def complete(self, request: ChatRequest) -> Completion:
        """One message, not streamed (the stage's hard deadline bounds it)."""
        body = orjson.dumps(
            messages_body(request, self.model, stream=False, defaults=self.defaults)
        )
        content = await self.post_json(self._url, body, request)
        return message_completion(self.name, content)


def message_completion(provider: str, content: bytes) -> Completion:
    """The :class:`Completion` of a whole ``message`` body (thinking is not answer text)."""
    try:
        data = orjson.loads(content)
        texts, calls = [], []
        json_answer = False
        for block in data["content"]:
            if block["type"] == "text":
                texts.append(str(block["text"]))
            elif block["type"] == "tool_use" and block["name"] == JSON_TOOL:
                json_answer = True
                texts.append(orjson.dumps(block["input"]).decode())
            elif block["type"] == "tool_use":
                arguments = orjson.dumps(block.get("input") or {}).decode()
                calls.append(ToolCall(str(block["id"]), str(block["name"]), arguments))
        reason = data.get("stop_reason")
        usage = usage_of(None, data.get("usage"))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise stream_error(provider, f"not a message: {content[:80]!r}", 0) from None
    finish = finish_of(provider, reason, json_answer=json_answer)
    return Completion("".join(texts), finish, usage, tool_calls=tuple(calls))


# -- the request ---------------------------------------------------------------------------


def messages_body(
    request: ChatRequest,
    default_model: str | None,
    stream: bool,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of a Messages request for ``request`` (see the module docstring)."""
    system, messages = _messages(request.messages)
    body: dict[str, Any] = {
        "model": model_of(request, default_model),
        "max_tokens": DEFAULT_MAX_TOKENS,  # required by the API
        **sampling_fields(request, defaults),
        "messages": messages,
    }
    if system:
        body["system"] = system
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    body.update(_tooling(request))
    if stream:
        body["stream"] = True
    body.update(request.extra)
    return body


def _messages(messages: Any) -> tuple[str, list[dict[str, Any]]]:
    """(system text, Anthropic messages) of neutral ``messages``; one role's run merged."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_plain(message.get("content"), "a system message"))
            continue
        if role not in ("user", "assistant", "tool"):
            raise ConfigError(f"request.messages: unknown role {role!r} for Anthropic")
        blocks = _blocks(role, message)
        role = "user" if role == "tool" else role
        if out and out[-1]["role"] == role:
            out[-1]["content"] = _as_blocks(out[-1]["content"]) + _as_blocks(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


def _blocks(role: str, message: Mapping[str, Any]) -> str | list[dict[str, Any]]:
    """The content of one message: its text, or its blocks."""
    content = message.get("content")
    if role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
        if content:
            result["content"] = _plain(content, "a tool result")
        return [result]
    blocks: list[dict[str, Any]] | str
    if isinstance(content, str) or content is None:
        blocks = content or ""
    else:
        blocks = [_part(part) for part in content]
    calls = message.get("tool_calls") if role == "assistant" else None
    if not calls:
        return blocks
    return [block for block in _as_blocks(blocks) if block.get("text") != ""] + [
        _tool_use(call) for call in calls
    ]


def _as_blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    """One content part: text, or an image (a URL, or a ``data:`` URL's base64 bytes)."""
    kind = part.get("type")
    if kind == "text":
        return {"type": "text", "text": part.get("text", "")}
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url", "") if isinstance(image, Mapping) else str(image or "")
        if url.startswith("data:"):
            head, _, data = url.partition(",")
            media_type = head[5:].removesuffix(";base64")
            if not head.endswith(";base64") or not data:
                raise ConfigError("request: an image data: URL must be base64 (data:TYPE;base64,…)")
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise ConfigError(f"request: content part type {kind!r} is not supported by Anthropic")


def _plain(content: Any, what: str) -> str:
    """The text of ``content`` (a text, or text parts only)."""
    if isinstance(content, str) or content is None:
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text":
            raise ConfigError(f"request: {what} may hold only text parts for Anthropic")
        texts.append(str(part.get("text", "")))
    return "\n".join(texts)


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        data = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise ConfigError(
            f"request: tool call {call.get('id')!r} has arguments that are not JSON"
        ) from None
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": data}


def _tooling(request: ChatRequest) -> dict[str, Any]:
    """``tools`` / ``tool_choice`` of the body, or the forced tool of a JSON answer."""
    if request.response_format and request.response_format.get("type") != "text":
        if request.tools:
            raise ConfigError(
                "request: Anthropic cannot combine tools with a response_format "
                "(the JSON answer is itself a forced tool); drop one of them"
            )
        return _json_tool(request.response_format)
    if not request.tools:
        if request.tool_choice in ("required",) or isinstance(request.tool_choice, Mapping):
            raise ConfigError("request: a tool_choice that needs a tool, but no tools are given")
        return {}
    out: dict[str, Any] = {"tools": [_tool(tool) for tool in request.tools]}
    if request.tool_choice is not None:
        out["tool_choice"] = _tool_choice(request.tool_choice)
    return out


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        raise ConfigError(f"request: tool of type {tool.get('type')!r} is not a function tool")
    out = {
        "name": function.get("name"),
        "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
    }
    if function.get("description"):
        out["description"] = function["description"]
    return out


def _tool_choice(choice: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name")
        if not name:
            raise ConfigError(f"request: tool_choice {choice!r} names no function")
        return {"type": "tool", "name": name}
    kinds = {"auto": "auto", "none": "none", "required": "any"}
    if choice not in kinds:
        raise ConfigError(f"request: tool_choice {choice!r} is not auto, none or required")
    return {"type": kinds[choice]}


def _json_tool(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON answer as one forced tool whose input schema is the answer's."""
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    description = "Give the answer as this tool's input."
    tool = {
        "name": JSON_TOOL,
        "description": description,
        "input_schema": schema or {"type": "object"},
    }
    return {"tools": [tool], "tool_choice": {"type": "tool", "name": JSON_TOOL}}


def _api_key(api_key: str | SecretStr | None, base_url: str) -> str | None:
    """The key as text; Anthropic itself needs one (a gateway may not)."""
    key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
    if not key and "api.anthropic.com" in base_url:
        raise ConfigError(
            "no API key for Anthropic: set ANTHROPIC_API_KEY, or provider.api_key "
            "(AI_LEASE_PROVIDER__API_KEY)"
        )
    return key
