"""Anthropic Messages API wire shapes for the loopback :class:`SSEServer`.

Builders of the events and bodies Anthropic documents (streaming messages; errors), as
bytes and :class:`Response` objects the server plays. Each event goes out as Anthropic
sends it: an ``event: <type>`` line, then ``data: <json>``::

    async with SSEServer() as server:
        server.enqueue(messages_sse(*message_events(["Hel", "lo"], usage=(10, 2))))
        provider = AnthropicProvider(base_url=anthropic_url(server), api_key="k", model="m")

There is no ``[DONE]``: ``message_stop`` is the end marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from tests.harness.sse_server import Event, Response, Sleep, SSEServer, json_response, sse

__all__ = [
    "anthropic_url",
    "error_event",
    "error_response",
    "event",
    "message_end",
    "message_events",
    "message_json",
    "message_start",
    "messages_sse",
    "ping",
    "text_block",
    "thinking_block",
    "tool_block",
]

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_url(server: SSEServer) -> str:
    """The ``base_url`` of ``server`` for the adapter (it appends ``/v1/messages``)."""
    return f"http://127.0.0.1:{server.port}"


def event(data: Mapping[str, Any]) -> bytes:
    """One SSE event as Anthropic frames it: ``event: <type>`` then ``data: <json>``."""
    return b"event: %b\ndata: %b\n\n" % (str(data["type"]).encode(), orjson.dumps(data))


def ping() -> bytes:
    return event({"type": "ping"})


def message_start(input_tokens: int = 10, model: str = "claude-test") -> bytes:
    message: dict[str, Any] = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1},
    }
    return event({"type": "message_start", "message": message})


def _block(
    index: int, block: Mapping[str, Any], deltas: Iterable[Mapping[str, Any]]
) -> list[bytes]:
    out = [event({"type": "content_block_start", "index": index, "content_block": block})]
    out += [event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
    out.append(event({"type": "content_block_stop", "index": index}))
    return out


def text_block(index: int, texts: Iterable[str]) -> list[bytes]:
    """A text block: start, one ``text_delta`` per text, stop."""
    deltas = [{"type": "text_delta", "text": text} for text in texts]
    return _block(index, {"type": "text", "text": ""}, deltas)


def thinking_block(
    index: int, pieces: Iterable[str], every: float = 0.0, signature: str = "sig=="
) -> list[Event]:
    """A thinking block: ``thinking_delta`` pieces (``every`` s apart), a signature."""
    head, *_ = _block(index, {"type": "thinking", "thinking": ""}, ())
    out: list[Event] = [head]
    for piece in pieces:
        if every:
            out.append(Sleep(every))
        delta = {"type": "thinking_delta", "thinking": piece}
        out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
    delta = {"type": "signature_delta", "signature": signature}
    out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
    out.append(event({"type": "content_block_stop", "index": index}))
    return out


def tool_block(index: int, id_: str, name: str, fragments: Iterable[str]) -> list[bytes]:
    """A ``tool_use`` block: its id and name, then ``input_json_delta`` fragments."""
    block = {"type": "tool_use", "id": id_, "name": name, "input": {}}
    deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in fragments]
    return _block(index, block, deltas)


def message_end(stop_reason: str | None = "end_turn", output_tokens: int = 5) -> list[bytes]:
    """``message_delta`` (stop reason, cumulative output tokens) and ``message_stop``."""
    delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}}
    delta["usage"] = {"output_tokens": output_tokens}
    return [event(delta), event({"type": "message_stop"})]


def error_event(kind: str = "overloaded_error", message: str = "Overloaded") -> bytes:
    return event({"type": "error", "error": {"type": kind, "message": message}})


def message_events(
    texts: Iterable[str], usage: tuple[int, int] = (10, 5), stop_reason: str = "end_turn"
) -> list[bytes]:
    """A whole streamed message of one text block, with a ping as Anthropic sends one."""
    prompt, output = usage
    return [
        message_start(prompt),
        *text_block(0, texts)[:1],
        ping(),
        *text_block(0, texts)[1:],
        *message_end(stop_reason, output),
    ]


def messages_sse(*events: Event, **options: Any) -> Response:
    """A Messages event stream (``text/event-stream``, no ``[DONE]``)."""
    return sse(*events, done=False, **options)


def message_json(
    text: str = "",
    usage: tuple[int, int] = (10, 5),
    *,
    tool_uses: Iterable[tuple[str, str, Any]] = (),
    thinking: str | None = None,
    stop_reason: str = "end_turn",
) -> dict[str, Any]:
    """A non-streaming ``message`` body: thinking, text, ``(id, name, input)`` tool uses."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "sig=="})
    if text:
        content.append({"type": "text", "text": text})
    content += [{"type": "tool_use", "id": i, "name": n, "input": x} for i, n, x in tool_uses]
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """An HTTP error as Anthropic sends it: ``{"type": "error", "error": {type, message}}``."""
    kind = _STATUS_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json_response(status, body, headers)
