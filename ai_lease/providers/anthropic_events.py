"""Anthropic Messages API stream events to :class:`Delta` objects, for the lean adapter.

Each event's ``data`` is JSON with a ``type`` (the SSE ``event:`` line repeats it and is
not read). What each one means here:

- ``content_block_delta`` / ``text_delta``: visible text (progress, counted in ``chunks``);
  ``thinking_delta``: reasoning (progress, never answer text); ``input_json_delta``: a piece
  of a tool call's arguments (progress); ``signature_delta``, ``citations_delta`` and any
  other delta: liveness only;
- ``content_block_start`` of a ``tool_use`` block: the call's id and name (no progress:
  empty arguments); tool calls are numbered 0, 1, … in the order their blocks start; a
  ``server_tool_use`` block (a tool Anthropic runs itself) and its input are liveness only;
- ``message_start``: the prompt's tokens; ``message_delta``: the stop reason and the
  cumulative usage, as one delta; ``message_stop``: the end marker;
- ``ping``, ``content_block_stop`` and event types this parser does not know: liveness
  (Anthropic documents that new event types may appear);
- ``error`` (``overloaded_error``, ``api_error`` …): a :class:`ProviderError`, retryable
  (unless its type is a request's fault) and ``partial`` once answer content (text or tool
  arguments) had arrived, so the call is never silently re-made within the stage.

Stop reasons: ``end_turn`` / ``stop_sequence`` → ``"stop"``; ``max_tokens`` and
``model_context_window_exceeded`` → ``"length"``; ``tool_use`` → ``"tool_calls"``;
``refusal`` and ``pause_turn`` fail, not retryable. The reserved tool :data:`JSON_TOOL`
(how the adapter asks for a JSON-schema answer) streams its arguments as visible text, and
its ``tool_use`` stop is ``"stop"``: the answer is the JSON text, as OpenAI would send it.
"""

from __future__ import annotations

from typing import Any

import orjson

from ai_lease.errors import EmptyEventStream, ProviderError, StreamInterrupted
from ai_lease.providers.base import Delta, ToolCallDelta, Usage
from ai_lease.providers.chunks import stream_error

__all__ = ["JSON_TOOL", "MessageEventParser", "finish_of", "usage_of"]

JSON_TOOL = "ai_lease_json_answer"
"""The forced tool a JSON-schema ``response_format`` becomes; its input is the answer."""

_loads = orjson.loads
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}
_FAILED = {
    "refusal": "the model refused to answer (stop_reason 'refusal'); rephrase the prompt",
    "pause_turn": "the model paused a long turn (stop_reason 'pause_turn'); ai_lease does "
    "not continue paused turns: drop server tools from the request",
}
# In-stream error types that are the request's fault: another try gets the same answer.
_REQUEST_FAULTS = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
    }
)


class MessageEventParser:
    """The deltas of one Messages stream's event payloads, read by read."""

    __slots__ = (
        "_blocks",
        "_json_blocks",
        "_prompt",
        "chunks",
        "error",
        "events",
        "finished",
        "provider",
        "stopped",
    )

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.chunks = 0  # payloads with answer content: text (or tool arguments)
        self.events = 0
        self.finished = False  # a stop reason came
        self.error: ProviderError | None = None
        self.stopped = False  # message_stop or an error: nothing more is read
        self._blocks: dict[int, int] = {}  # content block index -> tool call number
        self._json_blocks: set[int] = set()  # blocks of JSON_TOOL: their input is text
        self._prompt: dict[str, Any] = {}  # message_start's usage

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's payloads, up to ``message_stop`` or an error."""
        self.events += len(payloads)
        out: list[Delta] = []
        for data in payloads:
            try:
                obj = _loads(data)
                kind = obj["type"]
                if kind == "content_block_delta":  # the hot path: once per token
                    delta = obj["delta"]
                    if delta["type"] == "text_delta":
                        if text := delta["text"]:
                            self.chunks += 1
                            out.append(Delta(text))
                        continue
                    self._block_delta(obj["index"], delta, out)
                elif kind == "message_stop":
                    self.stopped = True
                    return out
                else:
                    self._other(kind, obj, out)
            except ProviderError as exc:
                self.error, self.stopped = exc, True
                return out
            except (ValueError, LookupError, TypeError, AttributeError):
                message = f"malformed event: {data[:80]!r}"
                self.error, self.stopped = stream_error(self.provider, message, self.chunks), True
                return out
        return out

    def end(self) -> None:
        """Once stopped: the error that stopped it, or :class:`StreamInterrupted` for a
        ``message_stop`` with no stop reason before it; nothing for a whole answer."""
        if self.error is not None:
            raise self.error
        if not self.finished:
            raise StreamInterrupted("message_stop came", provider=self.provider, chunks=self.chunks)

    def body_ended(self) -> None:
        """The body ended: after ``message_delta``'s stop reason the answer is whole though
        ``message_stop`` never came; before it, it is cut (:meth:`cut`)."""
        if self.finished and self.error is None:
            self.stopped = True

    def cut(self) -> ProviderError:
        """The body ended before ``message_stop``: no event at all, or a truncated stream."""
        if not self.events:
            return EmptyEventStream(provider=self.provider)
        return stream_error(self.provider, "the stream ended before message_stop", self.chunks)

    def _block_delta(self, index: int, delta: Any, out: list[Delta]) -> None:
        kind = delta["type"]
        if kind == "thinking_delta":
            if thinking := delta["thinking"]:
                out.append(Delta(reasoning=_text(thinking)))
        elif kind == "input_json_delta":
            piece = _text(delta["partial_json"])
            if not piece:
                return
            if index in self._json_blocks:
                self.chunks += 1
                out.append(Delta(piece))
            elif (number := self._blocks.get(index)) is not None:
                self.chunks += 1
                out.append(Delta(tool_calls=(ToolCallDelta(number, None, None, piece),)))
            # else a server tool's input (server_tool_use: Anthropic runs it): liveness
        # signature_delta, citations_delta, new kinds: liveness only

    def _other(self, kind: str, obj: Any, out: list[Delta]) -> None:
        if kind == "content_block_start":
            block = obj["content_block"]
            if block["type"] == "tool_use":
                self._tool_start(int(obj["index"]), block, out)
        elif kind == "message_delta":
            self._message_delta(obj, out)
        elif kind == "message_start":
            self._prompt = obj["message"].get("usage") or {}
        elif kind == "error":
            raise self._error_event(obj.get("error") or {})
        # ping, content_block_stop, unknown kinds: liveness only

    def _tool_start(self, index: int, block: Any, out: list[Delta]) -> None:
        name = _text(block["name"])
        if name == JSON_TOOL:
            self._json_blocks.add(index)
            return
        number = self._blocks[index] = len(self._blocks)
        out.append(Delta(tool_calls=(ToolCallDelta(number, _text(block["id"]), name, ""),)))

    def _message_delta(self, obj: Any, out: list[Delta]) -> None:
        reason = (obj.get("delta") or {}).get("stop_reason")
        usage = usage_of(self._prompt, obj.get("usage"))
        finish = finish_of(self.provider, reason, json_answer=bool(self._json_blocks))
        self.finished = self.finished or finish is not None
        if finish is not None or usage is not None:
            out.append(Delta(finish_reason=finish, usage=usage))

    def _error_event(self, error: Any) -> ProviderError:
        kind = str(error.get("type") or "error")
        message = str(error.get("message") or "")[:300]
        return ProviderError(
            f"error event in the stream: {kind}: {message}",
            retryable=kind not in _REQUEST_FAULTS,
            provider=self.provider,
            partial=self.chunks > 0,
        )


def finish_of(provider: str, reason: str | None, *, json_answer: bool = False) -> str | None:
    """The neutral finish reason of Anthropic's ``stop_reason``; a refusal or a paused
    turn is a :class:`ProviderError` (not retryable); an unknown reason passes as is."""
    if reason is None:
        return None
    if reason in _FAILED:
        raise ProviderError(_FAILED[reason], retryable=False, provider=provider)
    if reason == "tool_use" and json_answer:
        return "stop"
    return _FINISH.get(reason, reason)


def usage_of(prompt: Any, final: Any) -> Usage | None:
    """Usage from ``message_start``'s counts and ``message_delta``'s cumulative ones (the
    later wins); prompt tokens include cache reads and writes, as Anthropic bills them."""
    if not final and not prompt:
        return None
    merged = {**(prompt or {}), **{k: v for k, v in (final or {}).items() if v is not None}}
    read = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    prompt_tokens = sum(int(merged.get(name) or 0) for name in read)
    return Usage(prompt_tokens, int(merged.get("output_tokens") or 0))


def _text(value: Any) -> str:
    if value.__class__ is not str:
        raise TypeError(value)
    return str(value)
