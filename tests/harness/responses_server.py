"""A loopback OpenAI Responses API server, stateful, built on :class:`SSEServer`.

It speaks the wire shape of the published API reference: ``POST /v1/responses`` streams
named events (``event: response.output_text.delta`` + ``data: {"type": …,
"sequence_number": n, …}``) or, without ``stream``, answers the response object; a
background response (``"background": true``) is kept in memory, so
``GET /v1/responses/{id}?stream=true&starting_after=N`` replays its events after N (and
``GET /v1/responses/{id}`` answers the object). What each create answers is scripted:

    async with ResponsesServer() as server:
        server.script(text_events(["Hel", "lo"], usage=(3, 2)), every=0.05, cut_after=6)
        ...                                   # the live stream breaks after 6 events
        assert server.creates == 1            # POSTs to /v1/responses
        server.gone.add("resp_1")             # a GET of it now answers 404
        server.failed.add("resp_1")           # a GET stream of it replays response.failed

The background response itself always runs to its end (as OpenAI's does when the client
goes away): a cut or hung live stream does not cut what a resume replays. Raw scripted
responses (``server.enqueue(json_response(429, …))``) still answer first, in order.
Events of a script are plain dicts; the server stamps the response id and the sequence
numbers (from 0) at create.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from tests.harness.sse_server import (
    Cut,
    Event,
    Hang,
    Request,
    Response,
    Sleep,
    SSEServer,
    json_response,
    sse,
)

__all__ = [
    "ResponsesServer",
    "Script",
    "error_event",
    "event_bytes",
    "failed_event",
    "function_call_events",
    "incomplete_events",
    "response_object",
    "text_events",
]


# -- events --------------------------------------------------------------------------


def response_object(
    status: str = "in_progress",
    output: Sequence[dict[str, Any]] = (),
    usage: tuple[int, int, int] | tuple[int, int] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A response object (its ``id`` is stamped by the server)."""
    body: dict[str, Any] = {
        "id": "",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "m",
        "output": list(output),
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }
    if usage is not None:
        prompt, completion, *reasoning = usage
        body["usage"] = {
            "input_tokens": prompt,
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": reasoning[0] if reasoning else 0},
            "total_tokens": prompt + completion,
        }
    return body | fields


def _start() -> list[dict[str, Any]]:
    return [
        {"type": "response.created", "response": response_object("queued")},
        {"type": "response.in_progress", "response": response_object("in_progress")},
    ]


def _message(text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": [part]}


def text_events(
    pieces: Iterable[str],
    *,
    usage: tuple[int, int] | tuple[int, int, int] | None = (3, 2),
    reasoning: Iterable[str] = (),
    end: str = "completed",
) -> list[dict[str, Any]]:
    """A whole text answer as OpenAI streams it: created, in_progress, a reasoning item
    with its summary pieces (if any), the message item with one delta per piece, then
    ``response.completed`` with ``usage`` (``end="none"``: no terminal event)."""
    pieces, thoughts = list(pieces), list(reasoning)
    events = _start()
    index = 0
    if thoughts:
        events += [
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "reasoning"},
            },
            *(
                {"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": t}
                for t in thoughts
            ),
            {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning"}},
        ]
        index = 1
    where = {"item_id": "msg_1", "output_index": index, "content_index": 0}
    events += [
        {"type": "response.output_item.added", "output_index": index, "item": _message("")},
        {"type": "response.content_part.added", **where, "part": {"type": "output_text"}},
        *({"type": "response.output_text.delta", **where, "delta": p} for p in pieces),
        {"type": "response.output_text.done", **where, "text": "".join(pieces)},
        {"type": "response.output_item.done", "output_index": index, "item": _message("")},
    ]
    if end == "completed":
        final = response_object("completed", [_message("".join(pieces))], usage)
        events.append({"type": "response.completed", "response": final})
    return events


def function_call_events(
    name: str, pieces: Iterable[str], *, call_id: str = "call_1", usage: tuple[int, int] = (5, 7)
) -> list[dict[str, Any]]:
    """A function call whose arguments stream in ``pieces``, then ``response.completed``."""
    pieces = list(pieces)
    item = {"id": "fc_1", "type": "function_call", "call_id": call_id, "name": name}
    where = {"item_id": "fc_1", "output_index": 0}
    whole = {**item, "arguments": "".join(pieces), "status": "completed"}
    return [
        *_start(),
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "arguments": ""},
        },
        *({"type": "response.function_call_arguments.delta", **where, "delta": p} for p in pieces),
        {"type": "response.function_call_arguments.done", **where, "arguments": "".join(pieces)},
        {"type": "response.output_item.done", "output_index": 0, "item": whole},
        {"type": "response.completed", "response": response_object("completed", [whole], usage)},
    ]


def incomplete_events(
    pieces: Iterable[str], reason: str = "max_output_tokens"
) -> list[dict[str, Any]]:
    """Text that stops with ``response.incomplete`` for ``reason``."""
    pieces = list(pieces)
    final = response_object(
        "incomplete",
        [_message("".join(pieces))],
        (3, len(pieces)),
        incomplete_details={"reason": reason},
    )
    return [*text_events(pieces, end="none"), {"type": "response.incomplete", "response": final}]


def failed_event(code: str = "server_error", message: str = "The model crashed") -> dict[str, Any]:
    """``response.failed`` with its error."""
    error = {"code": code, "message": message}
    return {"type": "response.failed", "response": response_object("failed", error=error)}


def error_event(code: str = "server_error", message: str = "Upstream overloaded") -> dict[str, Any]:
    """A stream-level ``error`` event."""
    return {"type": "error", "code": code, "message": message, "param": None}


def event_bytes(event: dict[str, Any]) -> bytes:
    """One event on the wire: its name, then its JSON data."""
    return b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event))


# -- the server ------------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """What the next create answers: ``events`` (the whole response), ``every`` seconds
    apart; the live stream ``cut_after`` / ``hang_after`` that many events (the stored
    background response still holds them all); ``delay`` before the head."""

    events: Sequence[dict[str, Any]]
    every: float = 0.0
    cut_after: int | None = None
    hang_after: int | None = None
    delay: float = 0.0


class ResponsesServer:
    """A stateful loopback Responses API (module docstring). ``resume_every`` paces replays;
    ``ignore_starting_after`` replays every event, as a proxy that drops the query would."""

    def __init__(self) -> None:
        self.sse = SSEServer(responder=self._respond)
        self.scripts: deque[Script] = deque()
        self.stored: dict[str, list[dict[str, Any]]] = {}  # background responses' events
        self.gone: set[str] = set()
        self.failed: set[str] = set()
        self.creates = 0
        self.resumes = 0
        self.resume_every = 0.0
        self.ignore_starting_after = False  # replay from the start (a proxy dropping the query)

    def script(self, events: Sequence[dict[str, Any]], **options: Any) -> None:
        """Queue what the next create answers (see :class:`Script`)."""
        self.scripts.append(Script(events, **options))

    def enqueue(self, *responses: Response) -> None:
        """Raw responses that answer the next requests first (errors, odd bodies)."""
        self.sse.enqueue(*responses)

    @property
    def base_url(self) -> str:
        return self.sse.base_url

    @property
    def requests(self) -> list[Request]:
        return self.sse.requests

    @property
    def connections_open(self) -> int:
        return self.sse.connections_open

    async def wait_connections_open(self, count: int = 0, timeout_s: float = 2.0) -> None:
        await self.sse.wait_connections_open(count, timeout_s)

    async def __aenter__(self) -> ResponsesServer:
        await self.sse.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.sse.aclose()

    # -- answering --------------------------------------------------------------------

    def _respond(self, request: Request) -> Response:
        parts = urlsplit(request.path)
        if request.method == "POST" and parts.path == "/v1/responses":
            return self._create(request)
        prefix = "/v1/responses/"
        if request.method == "GET" and parts.path.startswith(prefix):
            return self._retrieve(parts.path[len(prefix) :], parse_qs(parts.query))
        return _not_found(f"no route for {request.method} {parts.path}")

    def _create(self, request: Request) -> Response:
        self.creates += 1
        if not self.scripts:
            return json_response(500, {"error": {"message": "no script queued for this create"}})
        script, body = self.scripts.popleft(), request.json or {}
        rid = f"resp_{self.creates}"
        events = _stamped(script.events, rid, background=bool(body.get("background")))
        if body.get("background"):
            self.stored[rid] = events
        if not body.get("stream"):
            return json_response(200, events[-1].get("response") or {}, delay=script.delay)
        steps = _paced(events, script.every)
        if script.cut_after is not None:
            steps = [*_paced(events[: script.cut_after], script.every), Cut()]
        elif script.hang_after is not None:
            steps = [*_paced(events[: script.hang_after], script.every), Hang()]
        return sse(*steps, done=False, delay=script.delay)

    def _retrieve(self, rid: str, query: dict[str, list[str]]) -> Response:
        events = self.stored.get(rid)
        if events is None or rid in self.gone:
            return _not_found(f"Response with id '{rid}' not found.")
        if query.get("stream") != ["true"]:
            return json_response(200, events[-1].get("response") or {})
        self.resumes += 1
        after = -1 if self.ignore_starting_after else int(query.get("starting_after", ["-1"])[0])
        if rid in self.failed:
            failed = {**failed_event(), "sequence_number": after + 1}
            failed["response"] = {**failed["response"], "id": rid}
            return sse(event_bytes(failed), done=False)
        rest = [event for event in events if event["sequence_number"] > after]
        return sse(*_paced(rest, self.resume_every), done=False)


def _stamped(
    events: Sequence[dict[str, Any]], rid: str, *, background: bool
) -> list[dict[str, Any]]:
    """The events with the response id and sequence numbers from 0."""
    out = []
    for number, event in enumerate(copy.deepcopy(list(events))):
        if isinstance(event.get("response"), dict):
            event["response"] |= {"id": rid, "background": background}
        out.append({**event, "sequence_number": number})
    return out


def _paced(events: Sequence[dict[str, Any]], every: float) -> list[Event]:
    steps: list[Event] = []
    for event in events:
        if every:
            steps.append(Sleep(every))
        steps.append(event_bytes(event))
    return steps


def _not_found(message: str) -> Response:
    error = {"message": message, "type": "invalid_request_error", "code": None}
    return json_response(404, {"error": error})
