"""``chat.completion.chunk`` payloads to :class:`Delta` objects, for the lean adapter.

One :class:`ChunkParser` per stream keeps the counts the stream's errors need (content
chunks so far, events, whether a finish reason came) and stops at ``[DONE]`` or at the first
chunk that is not one, keeping what came before it: the caller delivers that, then ends
the stream with :meth:`ChunkParser.end`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ai_lease.errors import EmptyEventStream, ProviderError, StreamInterrupted
from ai_lease.providers.base import Delta, ToolCallDelta, Usage

__all__ = ["ChunkParser", "refuse_filtered", "stream_error", "tool_call_deltas", "usage_of"]

_loads = orjson.loads


class ChunkParser:
    """The deltas of one stream's event payloads, read by read."""

    __slots__ = ("chunks", "done", "error", "events", "finished", "provider", "stopped")

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.chunks = 0  # content chunks so far (``partial`` of an error)
        self.events = 0
        self.finished = False  # a finish reason came
        self.done = False  # [DONE] came
        self.error: ProviderError | None = None  # a chunk that is not one
        self.stopped = False  # done or error: nothing more is read

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's payloads, up to ``[DONE]`` or a bad chunk."""
        self.events += len(payloads)
        out: list[Delta] = []
        for data in payloads:
            if data == b"[DONE]":
                self.done = self.stopped = True
                return out
            # Fast path, once per streamed token: one choice, text only.
            try:
                obj = _loads(data)
                choice = obj["choices"][0]
                delta = choice["delta"]
                text = delta["content"]
                fast = (
                    text.__class__ is str
                    and text
                    and choice["finish_reason"] is None
                    and obj.get("usage") is None
                    and (len(delta) == 1 or not _has_side(delta))
                )
            except (ValueError, LookupError, TypeError, AttributeError):
                obj, fast = None, False
            if fast:
                self.chunks += 1
                out.append(Delta(text))
            elif not self._slow(data, obj, out):
                return out
        return out

    def end(self) -> None:
        """Once stopped: the bad chunk's error, or :class:`StreamInterrupted` for a ``[DONE]``
        with no finish reason before it; nothing for a whole stream."""
        if self.error is not None:
            raise self.error
        if not self.finished:
            raise StreamInterrupted("[DONE] came", provider=self.provider, chunks=self.chunks)

    def body_ended(self) -> None:
        """The body ended: after a finish reason the answer is whole though ``[DONE]`` (and
        perhaps the usage chunk) never came — a buffering proxy drops them; before one, it is
        cut (:meth:`cut`)."""
        if self.finished and self.error is None:
            self.stopped = True

    def cut(self) -> ProviderError:
        """The body ended before ``[DONE]``: no event at all, or a truncated stream."""
        if not self.events:
            return EmptyEventStream(provider=self.provider)
        return stream_error(self.provider, "the stream ended before [DONE]", self.chunks)

    def _slow(self, data: bytes, obj: Any, out: list[Delta]) -> bool:
        """Every delta of one chunk into ``out``; False (and ``error`` set) if it is not one."""
        try:
            deltas = chunk_deltas(self.provider, data, self.chunks, obj)
        except ProviderError as exc:
            self.error, self.stopped = exc, True
            return False
        for delta in deltas:
            self.chunks += bool(delta.text)
            self.finished = self.finished or delta.finish_reason is not None
            out.append(delta)
        return True


def chunk_deltas(provider: str, data: bytes, chunks: int, obj: Any = None) -> list[Delta]:
    """Every delta of one chunk (the slow path); ``obj`` is the chunk already parsed."""
    try:
        if obj is None:
            obj = _loads(data)
        if "error" in obj:
            raise stream_error(provider, f"error in stream: {obj['error']}", chunks)
        out = []
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            if not isinstance(content, str) or not isinstance(reasoning, str):
                raise TypeError(content)
            calls = tool_call_deltas(delta.get("tool_calls"))
            finish = choice.get("finish_reason")
            refuse_filtered(provider, finish)
            if content or finish or reasoning or calls:
                out.append(Delta(content, finish, None, reasoning, calls))
        usage = obj.get("usage")
        if usage:
            out.append(Delta(usage=usage_of(usage)))
        return out
    except (ValueError, AttributeError, TypeError):  # JSONDecodeError is a ValueError
        raise stream_error(provider, f"malformed chunk: {data[:80]!r}", chunks) from None


def tool_call_deltas(data: Any) -> tuple[ToolCallDelta, ...]:
    """The tool-call fragments of one chunk's ``delta.tool_calls`` (a list, or null)."""
    if not data:
        return ()
    out = []
    for call in data:
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            raise TypeError(arguments)
        out.append(
            ToolCallDelta(
                int(call.get("index") or 0), call.get("id"), function.get("name"), arguments
            )
        )
    return tuple(out)


def _has_side(delta: Mapping[str, Any]) -> bool:
    """A delta carrying reasoning or tool calls beside its text (never the fast path)."""
    return bool(delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls"))


def usage_of(data: Mapping[str, Any] | None) -> Usage | None:
    """A ``usage`` object's counts; reasoning tokens from OpenAI's
    ``completion_tokens_details.reasoning_tokens`` (part of ``completion_tokens``)."""
    if not data:
        return None
    details = data.get("completion_tokens_details") or {}
    return Usage(
        int(data.get("prompt_tokens") or 0),
        int(data.get("completion_tokens") or 0),
        int(details.get("reasoning_tokens") or 0),
    )


def refuse_filtered(provider: str, finish: str | None) -> None:
    if finish == "content_filter":
        raise ProviderError(
            "the answer was stopped by the content filter", retryable=False, provider=provider
        )


def stream_error(provider: str, message: str, chunks: int) -> ProviderError:
    """A retryable failure of a stream that had delivered ``chunks`` content chunks."""
    return ProviderError(message, retryable=True, provider=provider, partial=chunks > 0)
