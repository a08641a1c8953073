"""The body of an Ollama ``/api/chat`` request, from the neutral OpenAI shapes.

What is translated and what is refused is told in :mod:`ai_lease.providers.ollama`'s
docstring: text parts joined, ``data:`` images inline (an image by URL is a
:class:`ConfigError`), tools as given, tool-call arguments as objects, ``response_format``
as ``format``, sampling settings in ``options``; a forced ``tool_choice`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.streaming import model_of, sampling_fields

__all__ = ["chat_body", "ollama_message", "response_format"]


def chat_body(
    request: ChatRequest,
    default_model: str | None,
    *,
    stream: bool,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of an ``/api/chat`` request (see the module's docstring)."""
    model = model_of(request, default_model)
    body: dict[str, Any] = {
        "model": model,
        "messages": [ollama_message(m) for m in request.messages],
        "stream": stream,
    }
    if request.tools and request.tool_choice != "none":
        check_tool_choice(request.tool_choice)
        body["tools"] = [dict(tool) for tool in request.tools]
    if request.response_format is not None:
        if (shape := response_format(request.response_format)) is not None:
            body["format"] = shape
    options = sampling_options(request, defaults or {})
    extra = dict(request.extra)
    options.update(extra.pop("options", None) or {})
    if options:
        body["options"] = options
    body.update(extra)
    return body


def sampling_options(request: ChatRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``options``: temperature, ``num_predict`` (max_tokens) and ``stop``, where set."""
    options = sampling_fields(request, defaults, "num_predict")
    if request.stop:
        options["stop"] = list(request.stop)
    return options


def ollama_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message in Ollama's shape: text content, inline ``images``, tool calls whose
    arguments are objects; ``tool_call_id`` / ``tool_name`` kept (a tool's ``name`` is
    its ``tool_name``)."""
    out: dict[str, Any] = {"role": message.get("role", "user")}
    content = message.get("content")
    if isinstance(content, list):
        out["content"], images = content_parts(content)
        if images:
            out["images"] = images
    else:
        out["content"] = content or ""
    if message.get("tool_calls"):
        out["tool_calls"] = [ollama_tool_call(call) for call in message["tool_calls"]]
    for key in ("tool_call_id", "tool_name", "thinking", "images"):
        if key in message and key not in out:
            out[key] = message[key]
    if out["role"] == "tool" and message.get("name") and "tool_name" not in out:
        out["tool_name"] = message["name"]
    return out


def content_parts(parts: list[Any]) -> tuple[str, list[str]]:
    """The text (parts joined by newlines) and base64 images of a content-part list."""
    texts, images = [], []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            texts.append(str(part.get("text") or ""))
        elif kind == "image_url":
            images.append(inline_image(part.get("image_url")))
        else:
            raise ConfigError(
                f"messages: content part type {kind!r} is not one Ollama takes (text, image_url)"
            )
    return "\n".join(texts), images


def inline_image(image: Any) -> str:
    """The base64 data of a ``data:…;base64,`` image URL; any other URL is refused."""
    url = image.get("url") if isinstance(image, Mapping) else image
    if not isinstance(url, str):
        raise ConfigError(f"messages: an image_url part without a url: {image!r:.80}")
    head, sep, data = url.partition(",")
    if url.startswith("data:") and sep and head.endswith(";base64") and data:
        return data
    raise ConfigError(
        f"messages: Ollama takes inline images only; {url[:60]!r} is not a "
        "data:image/...;base64,... URL (fetch the image and inline it)"
    )


def ollama_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call (arguments as JSON text) in Ollama's shape (an object)."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            raise ConfigError(
                f"messages: tool call {function.get('name')!r} has arguments that are not "
                f"JSON: {arguments[:60]!r}"
            ) from None
    out: dict[str, Any] = {"function": {"name": function.get("name"), "arguments": arguments}}
    if call.get("id"):
        out["id"] = call["id"]
    return out


def check_tool_choice(choice: str | Mapping[str, Any] | None) -> None:
    """Ollama has no ``tool_choice``: ``auto`` (its behaviour) passes, forcing is refused."""
    if choice in (None, "auto", "none"):
        return
    raise ConfigError(
        f"tool_choice: Ollama cannot force a tool call ({choice!r:.80}); "
        'leave tool_choice unset or "auto", or use a provider that can'
    )


def response_format(spec: Mapping[str, Any]) -> Any:
    """Ollama's ``format`` for an OpenAI ``response_format`` (None: plain text)."""
    kind = spec.get("type")
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        schema = (spec.get("json_schema") or {}).get("schema")
        if not isinstance(schema, Mapping):
            raise ConfigError("response_format: json_schema needs a schema object")
        return dict(schema)
    if kind in (None, "text"):
        return None
    raise ConfigError(
        f"response_format: type {kind!r} is not one of text, json_object, json_schema"
    )
