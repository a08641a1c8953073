"""Gemini ``GenerateContentResponse`` payloads to :class:`Delta` objects.

Each server-sent event of ``streamGenerateContent?alt=sse`` is one whole
``GenerateContentResponse``: ``candidates[0].content.parts[]`` (``text``, ``text`` with
``thought: true``, ``functionCall {name, args}``), ``candidates[0].finishReason`` on the
last one, ``usageMetadata`` (often on every event, cumulative) and, for a refused prompt,
``promptFeedback.blockReason`` with no candidates at all.

Progress is visible text, thought text and whole function calls (Gemini sends each call in
one part, never in fragments). An event with no parts, no text or no candidates is liveness.

There is no end sentinel: the stream is whole only when a ``finishReason`` came *and* the
body ended (:meth:`GeminiParser.body_ended`). ``STOP`` is ``"stop"`` (``"tool_calls"`` when
the answer called functions), ``MAX_TOKENS`` is ``"length"``; any other reason (``SAFETY``,
``RECITATION``, ``MALFORMED_FUNCTION_CALL``…) and a blocked prompt are non-retryable
:class:`ProviderError` naming it. An ``{"error": …}`` event under the 200 is an error too,
retryable when Google's code says so (429, 5xx).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ai_lease.errors import EmptyEventStream, ProviderError
from ai_lease.providers.base import Delta, ToolCallDelta, Usage
from ai_lease.providers.chunks import stream_error

__all__ = ["FINISHES", "GeminiParser", "usage_of"]

_loads = orjson.loads
FINISHES = {"STOP": "stop", "MAX_TOKENS": "length"}
"""The finish reasons that end a whole answer, and their neutral names."""
_RETRYABLE_STATUS = frozenset(
    {"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED"}
)


class GeminiParser:
    """The deltas of one Gemini stream's event payloads, read by read."""

    __slots__ = ("calls", "chunks", "error", "events", "finished", "provider", "stopped", "usage")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.chunks = 0  # events that brought visible text (``partial`` of an error)
        self.events = 0
        self.calls = 0  # function calls so far (their index, and "tool_calls" at STOP)
        self.finished = False  # STOP or MAX_TOKENS came
        self.usage: Any = None  # the latest usageMetadata, sent with the finish
        self.error: ProviderError | None = None
        self.stopped = False  # an error (or, once the body ended, a finish): read no more

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's payloads, up to an error payload."""
        self.events += len(payloads)
        out: list[Delta] = []
        for data in payloads:
            # Fast path, once per streamed token: one candidate, one text part, no finish.
            try:
                obj = _loads(data)
                candidate = obj["candidates"][0]
                parts = candidate["content"]["parts"]
                part = parts[0]
                text = part["text"]
                fast = (
                    len(parts) == 1
                    and len(part) == 1
                    and text.__class__ is str
                    and "finishReason" not in candidate
                )
            except (ValueError, LookupError, TypeError, AttributeError):
                obj, fast = None, False
            if fast:
                self.usage = obj.get("usageMetadata") or self.usage
                if text:
                    self.chunks += 1
                    out.append(Delta(text))
            elif not self._slow(data, obj, out):
                return out
        return out

    def body_ended(self) -> None:
        """The body ended: that is the end marker, once a finish reason came."""
        if self.finished:
            self.stopped = True

    def end(self) -> None:
        """Once stopped: the error that stopped it; nothing for a whole answer."""
        if self.error is not None:
            raise self.error

    def cut(self) -> ProviderError:
        """The body ended with no finish reason: no event at all, or a truncated stream."""
        if not self.events:
            return EmptyEventStream(provider=self.provider)
        return stream_error(
            self.provider, "the stream ended before a finishReason (truncated)", self.chunks
        )

    def _slow(self, data: bytes, obj: Any, out: list[Delta]) -> bool:
        """Every delta of one payload into ``out``; False (and ``error`` set) if it fails."""
        try:
            if obj is None:
                obj = _loads(data)
            self._response(obj, out)
        except ProviderError as exc:
            self.error, self.stopped = exc, True
            return False
        except (ValueError, LookupError, TypeError, AttributeError):
            message = f"not a GenerateContentResponse: {data[:80]!r}"
            self.error, self.stopped = stream_error(self.provider, message, self.chunks), True
            return False
        return True

    def _response(self, obj: Mapping[str, Any], out: list[Delta]) -> None:
        """One ``GenerateContentResponse`` (any shape) into ``out``."""
        if "error" in obj:
            raise event_error(self.provider, obj["error"], self.chunks)
        blocked = (obj.get("promptFeedback") or {}).get("blockReason")
        if blocked:
            raise ProviderError(
                f"Gemini blocked the prompt (blockReason {blocked}): change the prompt; "
                "a retry gets the same answer",
                retryable=False,
                provider=self.provider,
                partial=self.chunks > 0,
            )
        self.usage = obj.get("usageMetadata") or self.usage
        candidates = obj.get("candidates") or ()
        if candidates:
            self._candidate(candidates[0], out)
        elif self.finished and obj.get("usageMetadata"):
            out.append(Delta(usage=usage_of(self.usage)))  # usage sent after the finish

    def _candidate(self, candidate: Mapping[str, Any], out: list[Delta]) -> None:
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCallDelta] = []
        for part in (candidate.get("content") or {}).get("parts") or ():
            call = part.get("functionCall")
            if call is not None:
                calls.append(self._call(call))
                continue
            piece = part.get("text")
            if piece:
                if not isinstance(piece, str):
                    raise TypeError(piece)
                (reasoning if part.get("thought") else text).append(piece)
        finish = candidate.get("finishReason")
        if finish is not None:
            finish = self._finish(finish, candidate.get("finishMessage"))
        if text or reasoning or calls or finish:
            self.chunks += bool(text)
            usage = usage_of(self.usage) if finish else None
            out.append(Delta("".join(text), finish, usage, "".join(reasoning), tuple(calls)))

    def _call(self, call: Mapping[str, Any]) -> ToolCallDelta:
        """One whole function call as one fragment: ``args`` (an object) as JSON text."""
        name, args = call["name"], call.get("args") or {}
        if not isinstance(name, str) or not isinstance(args, dict):
            raise TypeError(call)
        index, self.calls = self.calls, self.calls + 1
        id_ = call.get("id") or f"call_{index}"
        return ToolCallDelta(index, str(id_), name, orjson.dumps(args).decode())

    def _finish(self, reason: Any, message: Any) -> str:
        """The neutral finish reason of a whole answer, else the error naming Gemini's."""
        if reason in FINISHES:
            self.finished = True
            stop = FINISHES[reason]
            return "tool_calls" if stop == "stop" and self.calls else stop
        detail = f": {str(message)[:200]}" if message else ""
        raise ProviderError(
            f"Gemini stopped the answer with finishReason {reason}{detail} "
            "(not a whole answer; a retry of the same prompt is likely to end the same way)",
            retryable=False,
            provider=self.provider,
            partial=self.chunks > 0,
        )


def event_error(provider: str, error: Any, chunks: int) -> ProviderError:
    """An ``{"error": {code, message, status}}`` event under a 200."""
    if not isinstance(error, Mapping):
        error = {"message": str(error)}
    code, status = error.get("code"), error.get("status")
    retryable = status in _RETRYABLE_STATUS or (
        isinstance(code, int) and (code >= 500 or code == 429)
    )
    message = str(error.get("message") or "(no message)")[:500]
    return ProviderError(
        f"error in stream: {code} {status}: {message}",
        retryable=retryable,
        provider=provider,
        status=code if isinstance(code, int) else None,
        partial=chunks > 0,
    )


def usage_of(data: Mapping[str, Any] | None) -> Usage | None:
    """``usageMetadata`` as :class:`Usage`: completion tokens count the thoughts too (what
    is billed as output, as OpenAI counts it), ``reasoning_tokens`` the thoughts apart."""
    if not data:
        return None
    thoughts = int(data.get("thoughtsTokenCount") or 0)
    answer = int(data.get("candidatesTokenCount") or 0)
    return Usage(int(data.get("promptTokenCount") or 0), answer + thoughts, thoughts)
