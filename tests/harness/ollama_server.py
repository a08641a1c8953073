"""Ollama ``/api/chat`` answers for the scripted loopback server (``sse_server.SSEServer``).

Built from Ollama's API documentation: a streamed answer is ``application/x-ndjson``, one
JSON object per ``\\n``-ended line, each sent as its own HTTP chunk (bytes events go out
verbatim); the last line has ``done: true`` with ``done_reason`` and the counts; errors are
``{"error": "…"}``, as a line under HTTP 200 or as the body of an HTTP error.

    async with SSEServer() as server:
        server.enqueue(ndjson(*chat_lines(["Hel", "lo"], usage=(3, 2))))
        provider = OllamaProvider(base_url=ollama_url(server), model="m")
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from tests.harness.sse_server import Event, Response, Sleep, SSEServer, json_response

__all__ = [
    "chat_json",
    "chat_lines",
    "done_line",
    "error_line",
    "line",
    "ndjson",
    "ollama_error",
    "ollama_url",
    "thinking_lines",
    "tool_call",
]

_CREATED_AT = "2025-05-27T22:54:57.641643Z"
_STATS = {"total_duration": 4_883_583_458, "load_duration": 1_334_875, "prompt_eval_duration": 1}


def ollama_url(server: SSEServer) -> str:
    """The server's base URL as Ollama's clients name it (no ``/v1``)."""
    return f"http://127.0.0.1:{server.port}"


def encode(event: Event) -> Event:
    """A dict as one JSON line; any other event (bytes, a step) as it is."""
    return orjson.dumps(event) + b"\n" if isinstance(event, dict) else event


def ndjson(
    *events: Event,
    status: int = 200,
    delay: float = 0.0,
    content_type: str = "application/x-ndjson",
) -> Response:
    """A streamed ``/api/chat`` answer playing ``events`` (dicts become JSON lines), chunked;
    ``delay`` seconds pass before the answer's head (a model loading)."""
    headers = (("Content-Type", content_type), ("Transfer-Encoding", "chunked"))
    return Response(status, headers, events=tuple(encode(e) for e in events), delay_s=delay)


def line(
    content: str = "",
    *,
    thinking: str | None = None,
    tool_calls: Sequence[dict[str, Any]] | None = None,
    model: str = "m",
) -> dict[str, Any]:
    """One ``done: false`` line (empty content and nothing else: a keep-alive)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking is not None:
        message["thinking"] = thinking
    if tool_calls is not None:
        message["tool_calls"] = list(tool_calls)
    return {"model": model, "created_at": _CREATED_AT, "message": message, "done": False}


def done_line(
    done_reason: str | None = "stop", usage: tuple[int, int] | None = (3, 2), model: str = "m"
) -> dict[str, Any]:
    """The last line: ``done: true``, the reason and ``(prompt_eval_count, eval_count)``."""
    out = line(model=model) | {"done": True, **_STATS}
    if done_reason is not None:
        out["done_reason"] = done_reason
    if usage is not None:
        out["prompt_eval_count"], out["eval_count"] = usage
    return out


def chat_lines(
    texts: Iterable[str], done_reason: str | None = "stop", usage: tuple[int, int] | None = (3, 2)
) -> list[dict[str, Any]]:
    """One line per text, then the ``done`` line (left out when ``done_reason`` is None)."""
    out = [line(text) for text in texts]
    if done_reason is not None:
        out.append(done_line(done_reason, usage))
    return out


def thinking_lines(pieces: int, every: float) -> list[Event]:
    """``pieces`` lines of thinking (empty content), ``every`` seconds apart."""
    events: list[Event] = []
    for i in range(pieces):
        events += [Sleep(every), line(thinking=f"step {i}. ")]
    return events


def tool_call(name: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One tool call as Ollama sends it: whole, its arguments an object."""
    return {"function": {"name": name, "arguments": arguments}, **extra}


def error_line(message: str) -> dict[str, Any]:
    """An error line, as Ollama writes one into a stream already answered 200."""
    return {"error": message}


def ollama_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An HTTP error with Ollama's ``{"error": "…"}`` body."""
    return json_response(status, {"error": message}, headers)


def chat_json(
    text: str,
    done_reason: str = "stop",
    usage: tuple[int, int] = (3, 2),
    tool_calls: Sequence[dict[str, Any]] | None = None,
) -> Response:
    """A whole answer (``stream: false``): one JSON object, ``application/json``."""
    body = done_line(done_reason, usage)
    body["message"]["content"] = text
    if tool_calls is not None:
        body["message"]["tool_calls"] = list(tool_calls)
    return json_response(200, body, {"Content-Type": "application/json; charset=utf-8"})
