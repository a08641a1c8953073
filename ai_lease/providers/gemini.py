"""``gemini``: Google's Gemini API, natively (``streamGenerateContent?alt=sse``).

``POST {base_url}/models/{model}:streamGenerateContent?alt=sse`` with the key in the
``x-goog-api-key`` header (never in the URL, where proxies and logs would keep it); a call
that is not streamed goes to ``:generateContent``. The request is translated from the
neutral, OpenAI-shaped :class:`ChatRequest` (see :func:`request_body`); the answer's events
are parsed by :class:`~ai_lease.providers.gemini_events.GeminiParser`.

What is Gemini's: there is no end sentinel, so a stream is an answer only when a
``finishReason`` came and the body then ended; a finish other than ``STOP`` /
``MAX_TOKENS`` (``SAFETY``, ``RECITATION``, ``MALFORMED_FUNCTION_CALL``…) and a blocked
prompt fail with the reason named, not retried. Thinking models think silently unless asked
for their thoughts, which would look like a dead stream to the first-token budget: the
request asks for them (``thinkingConfig.includeThoughts``, ``include_thoughts=False`` to
not), and thought text is progress, never answer text. ``usageMetadata`` becomes
:class:`Usage` with the thought tokens counted apart.

>>> provider = GeminiProvider(api_key="AIza…", model="gemini-2.5-flash")
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Unpack
from urllib.parse import quote

import orjson
from pydantic import SecretStr

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers.base import ChatRequest, Completion, assemble_tool_calls
from ai_lease.providers.gemini_events import GeminiParser
from ai_lease.providers.streaming import HTTPStreamProvider, StreamOptions, sampling_fields

__all__ = ["GeminiProvider", "request_body"]

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
SKIP_SIGNATURE = "skip_thought_signature_validator"
"""Google's documented stand-in for the thought signature of a replayed function call."""
_CHOICES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


def request_body(
    request: ChatRequest,
    defaults: Mapping[str, Any] | None = None,
    thoughts: bool = True,
    model: str = "",
) -> dict[str, Any]:
    """The JSON body of a ``generateContent`` request for ``request`` to ``model``;
    ``defaults`` (the provider's ``temperature`` / ``max_tokens``) fill what the request
    leaves unset."""
    system, contents = _contents(request.messages, _needs_signatures(model))
    body: dict[str, Any] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    if request.tools:
        body["tools"] = [{"functionDeclarations": [_declaration(t) for t in request.tools]}]
    if request.tool_choice is not None:
        body["toolConfig"] = {"functionCallingConfig": _calling(request.tool_choice)}
    if config := _generation(request, defaults or {}, thoughts):
        body["generationConfig"] = config
    for name, value in request.extra.items():  # one level deep: generationConfig stays whole
        old = body.get(name)
        body[name] = (
            {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
        )
    return body


def _generation(
    request: ChatRequest, defaults: Mapping[str, Any], thoughts: bool
) -> dict[str, Any]:
    config = sampling_fields(request, defaults, "maxOutputTokens")
    if request.stop:
        config["stopSequences"] = list(request.stop)
    config.update(_response_format(request.response_format))
    if thoughts:
        config["thinkingConfig"] = {"includeThoughts": True}
    return config


def _response_format(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """``response_format`` as generation settings: JSON, with the schema as JSON Schema."""
    kind = (spec or {}).get("type")
    if kind == "json_object":
        return {"responseMimeType": "application/json"}
    if kind == "json_schema":
        schema = (spec or {}).get("json_schema", {}).get("schema")
        out: dict[str, Any] = {"responseMimeType": "application/json"}
        if schema is not None:
            out["responseJsonSchema"] = schema  # JSON Schema as is (responseSchema is OpenAPI)
        return out
    return {}


def _declaration(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI ``{"type": "function", "function": {…}}`` tool as a function declaration."""
    function = tool.get("function", tool)
    out: dict[str, Any] = {"name": function["name"]}
    if function.get("description"):
        out["description"] = function["description"]
    if function.get("parameters") is not None:
        out["parametersJsonSchema"] = function["parameters"]
    return out


def _calling(choice: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise ConfigError(f"tool_choice: {choice!r} is not auto, none, required or a function")
        return {"mode": _CHOICES[choice]}
    name = (choice.get("function") or {}).get("name")
    if not name:
        raise ConfigError(f"tool_choice: {choice!r} names no function")
    return {"mode": "ANY", "allowedFunctionNames": [name]}


def _needs_signatures(model: str) -> bool:
    """Gemini 3 and later refuse (400) a replayed function call without the thought
    signature it came with; the neutral tool call carries none, so Google's documented
    stand-in is sent (Gemini 1 and 2, and other models, need and get nothing)."""
    return model.startswith("gemini-") and not model.startswith(("gemini-1", "gemini-2"))


def _contents(
    messages: Iterable[Mapping[str, Any]], signatures: bool = False
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The system parts, and the turns: ``user`` / ``model``; a run of tool results is one
    ``user`` turn of ``functionResponse`` parts, named after the call they answer. With
    ``signatures``, a model turn's first function call bears the stand-in signature."""
    system: list[Any] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_call_id -> function name
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.extend(_parts(message.get("content")))
        elif role == "assistant":
            contents.append(_model_turn(message, names, signatures))
        elif role == "tool":
            part = _function_response(message, names)
            if contents and contents[-1].get("tool"):
                contents[-1]["parts"].append(part)
            else:
                contents.append({"role": "user", "parts": [part], "tool": True})
        else:
            contents.append({"role": "user", "parts": _parts(message.get("content"))})
    for content in contents:
        content.pop("tool", None)
    return system, contents


def _model_turn(
    message: Mapping[str, Any], names: dict[str, str], signatures: bool
) -> dict[str, Any]:
    """An assistant message as a ``model`` turn (its tool calls' names noted in ``names``)."""
    parts = _parts(message.get("content"))
    for n, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        names[call.get("id") or ""] = function.get("name") or ""
        part: dict[str, Any] = {
            "functionCall": {"name": function.get("name"), "args": _args(function)}
        }
        if signatures and n == 0:
            part["thoughtSignature"] = SKIP_SIGNATURE
        parts.append(part)
    return {"role": "model", "parts": parts}


def _args(function: Mapping[str, Any]) -> Any:
    text = function.get("arguments") or "{}"
    try:
        return orjson.loads(text) if isinstance(text, str) else text
    except orjson.JSONDecodeError:
        raise ConfigError(f"tool call arguments are not JSON: {text[:80]!r}") from None


def _function_response(message: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """A tool message as a ``functionResponse``: a JSON object as is, anything else wrapped."""
    name = message.get("name") or names.get(message.get("tool_call_id") or "")
    if not name:
        raise ConfigError(
            f"tool message {message.get('tool_call_id')!r}: Gemini needs the function's name; "
            "keep the assistant message with its tool_calls before it, or set 'name'"
        )
    text = "".join(p.get("text", "") for p in _parts(message.get("content")))
    try:
        result = orjson.loads(text)
    except orjson.JSONDecodeError:
        result = None
    response = (
        result if isinstance(result, dict) else {"result": result if result is not None else text}
    )
    return {"functionResponse": {"name": name, "response": response}}


def _parts(content: str | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """OpenAI content (a text, or text / image_url parts) as Gemini parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    out: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            out.append({"text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            out.append(_image(image.get("url", "") if isinstance(image, Mapping) else str(image)))
        else:
            raise ConfigError(
                f"message content part of type {kind!r}: Gemini takes text and image_url"
            )
    return out


def _image(url: str) -> dict[str, Any]:
    """A ``data:`` URL inline; an http(s) URL by reference, its type guessed from its name."""
    if url.startswith("data:"):
        head, _, data = url[5:].partition(",")
        mime, _, encoding = head.partition(";")
        if encoding != "base64":
            raise ConfigError("image_url: a data: URL must be base64 (data:image/png;base64,…)")
        try:
            base64.b64decode(data, validate=True)
        except binascii.Error:
            raise ConfigError("image_url: the data: URL's base64 does not decode") from None
        return {"inlineData": {"mimeType": mime or "image/png", "data": data}}
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"image_url: {url[:40]!r} is neither an http(s) nor a data: URL")
    mime = mimetypes.guess_type(url.split("?", 1)[0])[0] or "image/jpeg"
    return {"fileData": {"fileUri": url, "mimeType": mime}}


class GeminiProvider(HTTPStreamProvider):
    """Streams Gemini's ``generateContent`` with aiohttp or httpx.

    >>> provider = GeminiProvider(api_key="AIza…", model="gemini-2.5-flash")
    """

    name = "gemini"

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        include_thoughts: bool = True,
        **options: Unpack[StreamOptions],
    ) -> None:
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if not key and "googleapis.com" in base_url:
            raise ConfigError(
                "no API key for Gemini: set GEMINI_API_KEY or GOOGLE_API_KEY, or "
                "provider.api_key (AI_LEASE_PROVIDER__API_KEY)"
            )
        super().__init__(
            base_url=base_url,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            **options,
        )
        self.include_thoughts = include_thoughts
        self._base = base_url.rstrip("/")
        self._headers = {"x-goog-api-key": key} if key else {}

    def __repr__(self) -> str:  # never shows the key
        return f"GeminiProvider(base_url={self._base!r}, model={self.model!r}, http={self.http!r})"

    def stream_request(self, request: ChatRequest) -> tuple[str, bytes, dict[str, str]]:
        url = self._url(request, "streamGenerateContent") + "?alt=sse"
        return url, self._body(request), self._post_headers(request)

    def parser(self) -> GeminiParser:
        return GeminiParser(self.name)

    async def complete(self, request: ChatRequest) -> Completion:
        url, body = self._url(request, "generateContent"), self._body(request)
        content = await self.post_json(url, body, request)
        return self._completion(content)

    def _completion(self, content: bytes) -> Completion:
        """One whole ``GenerateContentResponse`` as a completion (or its error)."""
        parser = self.parser()
        deltas = parser.deltas([content])
        parser.end()
        finish = next((d.finish_reason for d in deltas if d.finish_reason), None)
        if finish is None:
            raise ProviderError(
                f"not a whole GenerateContentResponse (no finishReason): {content[:80]!r}",
                retryable=True,
                provider=self.name,
            )
        calls = [call for delta in deltas for call in delta.tool_calls]
        text = "".join(delta.text for delta in deltas)
        usage = next((d.usage for d in reversed(deltas) if d.usage), None)
        return Completion(text, finish, usage, parser.chunks, assemble_tool_calls(calls))

    def _model(self, request: ChatRequest) -> str:
        model = request.model or self.model
        if not model:
            raise ConfigError("provider.model: no model given (set it in the job or the settings)")
        return model.removeprefix("models/")

    def _url(self, request: ChatRequest, method: str) -> str:
        return f"{self._base}/models/{quote(self._model(request), safe='')}:{method}"

    def _body(self, request: ChatRequest) -> bytes:
        body = request_body(request, self.defaults, self.include_thoughts, self._model(request))
        return orjson.dumps(body)
