"""The loopback Responses server with what background mode adds: cancels, and responses
that think silently on every stream of them.

``POST /v1/responses/{id}/cancel`` is counted (``cancels``, the ids in order), marks the
stored response cancelled and answers its object with ``status: "cancelled"`` (404 for an
unknown id; ``cancel_delay`` holds the answer back, a provider slow to cancel). With
``silent_after=n`` a background response has, for now, only its first ``n`` events
(``response.created``, ``response.in_progress``: a model reasoning without a word): its live
stream and every resume send what they have after ``starting_after`` and then hang, as the
real API does while the model thinks. A resume of a cancelled response sends what it has and
ends, with no terminal event.

    async with BackgroundResponsesServer(silent_after=2) as server:
        server.script(text_events(["never"]))
        ...
        assert server.creates == 1 and server.cancelled == ["resp_1"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.harness.responses_server import ResponsesServer, event_bytes, response_object
from tests.harness.sse_server import Hang, Request, Response, json_response, sse

__all__ = ["BackgroundResponsesServer"]


class BackgroundResponsesServer(ResponsesServer):
    """A :class:`ResponsesServer` that cancels and thinks silently (module docstring)."""

    def __init__(self, *, silent_after: int | None = None, cancel_delay: float = 0.0) -> None:
        super().__init__()
        self.silent_after, self.cancel_delay = silent_after, cancel_delay
        self.cancelled: list[str] = []  # every cancel request's id, in order

    async def __aenter__(self) -> BackgroundResponsesServer:
        await super().__aenter__()
        return self

    @property
    def cancels(self) -> int:
        return len(self.cancelled)

    def created_ids(self) -> list[str]:
        """The ids of the responses created so far."""
        return [f"resp_{n}" for n in range(1, self.creates + 1)]

    def script(self, events: Sequence[dict[str, Any]], **options: Any) -> None:
        """Queue what the next create answers; a silent server's live stream hangs after
        its first ``silent_after`` events."""
        if self.silent_after is not None:
            options.setdefault("hang_after", self.silent_after)
        super().script(events, **options)

    def _respond(self, request: Request) -> Response:
        parts = urlsplit(request.path)
        prefix, suffix = "/v1/responses/", "/cancel"
        if request.method == "POST" and parts.path.startswith(prefix):
            return self._cancel(parts.path[len(prefix) :].removesuffix(suffix))
        if request.method == "GET" and parts.path.startswith(prefix):
            rid = parts.path[len(prefix) :]
            if rid in self.cancelled or (self.silent_after is not None and rid in self.stored):
                return self._replay_so_far(rid, parse_qs(parts.query))
        return super()._respond(request)

    def _cancel(self, rid: str) -> Response:
        self.cancelled.append(rid)
        if rid not in self.stored:
            error = {"message": f"Response with id '{rid}' not found.", "code": None}
            return json_response(404, {"error": error}, delay=self.cancel_delay)
        body = response_object("cancelled") | {"id": rid, "background": True}
        return json_response(200, body, delay=self.cancel_delay)

    def _replay_so_far(self, rid: str, query: dict[str, list[str]]) -> Response:
        """What a response thinking silently (or cancelled) has after ``starting_after``."""
        self.resumes += 1
        after = int(query.get("starting_after", ["-1"])[0])
        have = self.stored[rid][: self.silent_after]
        rest = [event_bytes(event) for event in have if event["sequence_number"] > after]
        if rid in self.cancelled:
            return sse(*rest, done=False)
        return sse(*rest, Hang(), done=False)
