"""The request shapes a job may carry, checked and bounded: tools, tool choice, response
format and images (OpenAI's chat shapes; each adapter translates them).

Everything here comes from outside (a job file, a stored spec), so every count and size is
bounded and every problem names its field: ``tools[2].function.name: …``. The bounds:

* ``tools``: at most :data:`MAX_TOOLS` function tools (OpenAI's own limit), names of 1-64
  letters, digits, ``_`` or ``-``, unique; all of them together at most
  :data:`MAX_TOOLS_BYTES` of JSON;
* ``tool_choice``: ``"auto"``, ``"none"``, ``"required"`` or
  ``{"type": "function", "function": {"name": …}}`` naming one of the tools;
* ``response_format``: ``{"type": "json_object"}`` or ``{"type": "json_schema",
  "json_schema": {"name": …, "schema": {…}, "strict": …}}``, at most
  :data:`MAX_RESPONSE_FORMAT_BYTES` of JSON;
* ``images``: at most :data:`MAX_IMAGES` URLs, each ``http(s)://`` (at most
  :data:`MAX_IMAGE_URL_CHARS` characters) or a base64 ``data:image/…`` URL of at most
  :data:`MAX_IMAGE_BYTES` decoded, all data URLs together at most
  :data:`MAX_IMAGES_BYTES`.

>>> check_shapes("k", tools=None, tool_choice=None, response_format=None, images=None)
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson

from ai_lease.errors import JobSpecError

__all__ = [
    "MAX_IMAGES",
    "MAX_IMAGES_BYTES",
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_URL_CHARS",
    "MAX_RESPONSE_FORMAT_BYTES",
    "MAX_TOOLS",
    "MAX_TOOLS_BYTES",
    "check_shapes",
    "image_parts",
]

MAX_TOOLS = 128
MAX_TOOLS_BYTES = 256 * 1024
MAX_RESPONSE_FORMAT_BYTES = 64 * 1024
MAX_IMAGES = 16
MAX_IMAGE_URL_CHARS = 8192
MAX_IMAGE_BYTES = 8 * 2**20
MAX_IMAGES_BYTES = 16 * 2**20

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
_SCHEMA_KEYS = {"name", "description", "schema", "strict"}
_CHOICES = ("auto", "none", "required")
_DATA_URL = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,", re.IGNORECASE)


class _Problem(Exception):
    """One bad value, said relative to the field (``tools[2].function.name: …``)."""


def check_shapes(
    key: str,
    *,
    tools: Any,
    tool_choice: Any,
    response_format: Any,
    images: Any,
) -> None:
    """Raise :class:`JobSpecError` naming the field if any of a job's request shapes is
    wrong or over its bound; None (unset) is always fine."""
    try:
        names = _check_tools(tools) if tools is not None else set()
        if tool_choice is not None:
            _check_tool_choice(tool_choice, names, tools is not None)
        if response_format is not None:
            _check_response_format(response_format)
        if images is not None:
            _check_images(images)
    except _Problem as exc:
        raise JobSpecError(f"job {key!r}: {exc}") from None


def image_parts(text: str, images: Sequence[str]) -> list[dict[str, Any]]:
    """A user message's content parts: the text, then each image URL."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return parts


def _json_size(field: str, value: Any, limit: int) -> None:
    try:
        size = len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise _Problem(f"{field}: not a JSON value ({exc})") from None
    if size > limit:
        raise _Problem(f"{field}: {size} bytes of JSON, over the limit of {limit}")


def _table(field: str, value: Any, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _Problem(f"{field}: must be a table/object, got {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise _Problem(
            f"{field}: unknown field {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )
    return value


def _name(field: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise _Problem(f"{field}: must be 1 to 64 letters, digits, '_' or '-', got {value!r:.80}")
    return value


def _check_tools(tools: Any) -> set[str]:
    """The tools' names, once every tool is a well-formed function tool."""
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise _Problem(f"tools: must be a list of function tools, got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise _Problem(f"tools: {len(tools)} tools, over the limit of {MAX_TOOLS}")
    _json_size("tools", list(tools), MAX_TOOLS_BYTES)
    names: set[str] = set()
    for index, tool in enumerate(tools):
        at = f"tools[{index}]"
        tool = _table(at, tool, _TOOL_KEYS)
        if tool.get("type") != "function":
            raise _Problem(f"{at}.type: must be 'function', got {tool.get('type')!r:.40}")
        function = _table(f"{at}.function", tool.get("function"), _FUNCTION_KEYS)
        name = _name(f"{at}.function.name", function.get("name"))
        if name in names:
            raise _Problem(f"{at}.function.name: {name!r} is given twice; names must be unique")
        names.add(name)
        _check_function(f"{at}.function", function)
    return names


def _check_function(at: str, function: Mapping[str, Any]) -> None:
    if not isinstance(function.get("description", ""), str):
        raise _Problem(f"{at}.description: must be text")
    if not isinstance(function.get("parameters", {}), Mapping):
        raise _Problem(f"{at}.parameters: must be a JSON schema object")
    if not isinstance(function.get("strict", False), bool):
        raise _Problem(f"{at}.strict: must be true or false")


def _check_tool_choice(choice: Any, names: set[str], has_tools: bool) -> None:
    if not has_tools:
        raise _Problem("tool_choice: given without tools; give the tools it chooses among")
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise _Problem(
                f"tool_choice: must be {', '.join(map(repr, _CHOICES))} or "
                f"{{type = 'function', function = {{name = …}}}}, got {choice!r:.40}"
            )
        return
    choice = _table("tool_choice", choice, _TOOL_KEYS)
    if choice.get("type") != "function":
        raise _Problem(f"tool_choice.type: must be 'function', got {choice.get('type')!r:.40}")
    function = _table("tool_choice.function", choice.get("function"), {"name"})
    name = _name("tool_choice.function.name", function.get("name"))
    if name not in names:
        raise _Problem(f"tool_choice.function.name: {name!r} is not one of the job's tools")


def _check_response_format(value: Any) -> None:
    value = _table("response_format", value, {"type", "json_schema"})
    _json_size("response_format", value, MAX_RESPONSE_FORMAT_BYTES)
    kind = value.get("type")
    if kind == "json_object":
        if "json_schema" in value:
            raise _Problem("response_format.json_schema: only with type 'json_schema'")
        return
    if kind != "json_schema":
        raise _Problem(
            f"response_format.type: must be 'json_object' or 'json_schema', got {kind!r:.40}"
        )
    schema = _table("response_format.json_schema", value.get("json_schema"), _SCHEMA_KEYS)
    _name("response_format.json_schema.name", schema.get("name"))
    if not isinstance(schema.get("schema"), Mapping):
        raise _Problem("response_format.json_schema.schema: must be a JSON schema object")
    if not isinstance(schema.get("strict", False), bool):
        raise _Problem("response_format.json_schema.strict: must be true or false")
    if not isinstance(schema.get("description", ""), str):
        raise _Problem("response_format.json_schema.description: must be text")


def _check_images(images: Any) -> None:
    if not isinstance(images, Sequence) or isinstance(images, str):
        raise _Problem(f"images: must be a list of image URLs, got {type(images).__name__}")
    if len(images) > MAX_IMAGES:
        raise _Problem(f"images: {len(images)} images, over the limit of {MAX_IMAGES}")
    total = 0
    for index, url in enumerate(images):
        total += _check_image(f"images[{index}]", url)
        if total > MAX_IMAGES_BYTES:
            raise _Problem(
                f"images[{index}]: the data URLs come to over {MAX_IMAGES_BYTES} bytes "
                "together; link large images by http(s) URL instead"
            )


def _check_image(at: str, url: Any) -> int:
    """The decoded size of a data URL (0 for an http(s) URL), once the URL is good."""
    if not isinstance(url, str):
        raise _Problem(f"{at}: must be an image URL (text), got {type(url).__name__}")
    if match := _DATA_URL.match(url):
        return _data_size(at, url[match.end() :])
    if len(url) > MAX_IMAGE_URL_CHARS:
        raise _Problem(f"{at}: {len(url)} characters, over the limit of {MAX_IMAGE_URL_CHARS}")
    try:
        parts = urlsplit(url)
        scheme, host = parts.scheme, parts.hostname
    except ValueError:
        scheme, host = "", None
    if scheme not in ("http", "https") or not host:
        raise _Problem(  # never the URL itself: it may hold a password
            f"{at}: not an http(s) URL with a host (scheme {scheme[:20]!r}); give one, "
            "or a base64 data:image/(png|jpeg|gif|webp) URL"
        )
    return 0


def _data_size(at: str, data: str) -> int:
    """The decoded size of a data URL's base64 text, checked before it is decoded."""
    estimate = len(data) * 3 // 4
    if estimate > MAX_IMAGE_BYTES + 2:
        raise _Problem(
            f"{at}: a data URL of about {estimate} bytes, over the limit of {MAX_IMAGE_BYTES}; "
            "link large images by http(s) URL instead"
        )
    try:
        size = len(binascii.a2b_base64(data, strict_mode=True))
    except binascii.Error as exc:
        raise _Problem(f"{at}: the data URL is not valid base64 ({exc})") from None
    if size > MAX_IMAGE_BYTES:
        raise _Problem(f"{at}: a data URL of {size} bytes, over the limit of {MAX_IMAGE_BYTES}")
    return size
