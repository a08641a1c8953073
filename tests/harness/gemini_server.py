"""Gemini wire shapes for the loopback server (:mod:`tests.harness.sse_server`).

``streamGenerateContent?alt=sse`` answers ``text/event-stream`` whose every event is one
whole ``GenerateContentResponse``, each ``data: {…}`` ended by ``\\r\\n\\r\\n`` as Google's
frontend sends it; there is no ``[DONE]``: the body simply ends after the event carrying
``finishReason``. Errors are ``{"error": {"code", "message", "status"}}``.

    async with SSEServer() as server:
        server.enqueue(gemini_sse(*gemini_stream(["Hel", "lo"], usage=(3, 2, 5))))
        provider = GeminiProvider(base_url=server.base_url, api_key="k", model="gemini-test")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from tests.harness.sse_server import Event, Response, Sleep, json_response, sse

__all__ = [
    "call_part",
    "gemini_error",
    "gemini_event",
    "gemini_response",
    "gemini_sse",
    "gemini_stream",
    "response_json",
    "thinking",
    "usage_metadata",
]

MODEL_VERSION = "gemini-test-001"
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def usage_metadata(prompt: int, answer: int, thoughts: int = 0) -> dict[str, int]:
    """``usageMetadata`` (``candidatesTokenCount`` excludes the thoughts, as Gemini counts)."""
    usage = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": answer,
        "totalTokenCount": prompt + answer + thoughts,
    }
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def call_part(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A ``functionCall`` part: Gemini sends each call whole, never in pieces."""
    return {"functionCall": {"name": name, "args": dict(args)}}


def gemini_response(
    parts: Iterable[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    usage: tuple[int, int, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One ``GenerateContentResponse`` with one candidate (``usage``: prompt, answer,
    thought tokens); ``extra`` candidate fields, e.g. ``finishMessage``."""
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}, "index": 0}
    if finish_reason is not None:
        candidate["finishReason"] = finish_reason
    candidate.update(extra)
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL_VERSION}
    if usage is not None:
        body["usageMetadata"] = usage_metadata(*usage)
    return body


def gemini_event(body: Mapping[str, Any]) -> bytes:
    """One event as Google frames it: ``data: {json}\\r\\n\\r\\n``."""
    return b"data: " + orjson.dumps(body) + b"\r\n\r\n"


def gemini_stream(
    texts: Iterable[str],
    *,
    thoughts: Iterable[str] = (),
    calls: Iterable[tuple[str, Mapping[str, Any]]] = (),
    finish_reason: str | None = "STOP",
    usage: tuple[int, int, int] | None = None,
) -> list[Event]:
    """A whole stream: thought parts, text parts, function calls, then the last text
    event carrying ``finishReason`` and ``usageMetadata`` (left out when None: a stream
    cut off mid-answer); every event but the last carries the usage so far, as Gemini does."""
    bodies = [gemini_response([{"text": t, "thought": True}]) for t in thoughts]
    bodies += [gemini_response([{"text": t}]) for t in texts]
    bodies += [gemini_response([call_part(name, args)]) for name, args in calls]
    final = []
    if finish_reason is not None:
        parts = bodies.pop()["candidates"][0]["content"]["parts"] if bodies else []
        final = [gemini_response(parts, finish_reason, usage)]
    if usage is not None:
        for body in bodies:
            body["usageMetadata"] = {"promptTokenCount": usage[0], "totalTokenCount": usage[0]}
    return [gemini_event(body) for body in bodies + final]


def thinking(pieces: int, every: float) -> list[Event]:
    """``pieces`` thought parts, ``every`` seconds apart (the first after one pause)."""
    events: list[Event] = []
    for i in range(pieces):
        events += [
            Sleep(every),
            gemini_event(gemini_response([{"text": f"step {i}. ", "thought": True}])),
        ]
    return events


def gemini_sse(
    *events: Event, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A Gemini event stream: no ``[DONE]``, the body ends after the last event."""
    return sse(*events, status=status, headers=headers, done=False)


def gemini_error(
    code: int, message: str, headers: Mapping[str, str] | None = None, status: str | None = None
) -> Response:
    """Google's JSON error answer: ``gemini_error(429, "Quota", {"Retry-After": "1"})``."""
    body = {
        "error": {
            "code": code,
            "message": message,
            "status": status or _STATUS.get(code, "UNKNOWN"),
        }
    }
    return json_response(code, body, headers)


def response_json(body: Mapping[str, Any]) -> Response:
    """A non-streamed ``generateContent`` answer."""
    return json_response(200, dict(body))
