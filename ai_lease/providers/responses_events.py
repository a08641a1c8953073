"""What OpenAI's Responses API sends back: stream events as :class:`Delta` objects, and a
whole response object as a :class:`Completion` (:func:`completion_of`), for the lean adapter.

The Responses API streams named events (``event: response.output_text.delta`` beside a
``data:`` JSON that repeats the name in ``"type"`` and numbers the event in
``"sequence_number"``). One :class:`ResponsesParser` per stream turns them into deltas:

- ``response.output_text.delta`` is answer text; ``response.reasoning_summary_text.delta``
  and ``response.reasoning_text.delta`` are reasoning; ``response.function_call_arguments.delta``
  is a tool-call fragment (``index`` = the item's ``output_index``, ``id`` = its ``call_id``,
  the name from its ``response.output_item.added``). All of these are progress.
- ``response.created`` / ``queued`` / ``in_progress`` (they bring the response id),
  ``output_item.added`` / ``done``, ``content_part.*``, ``*.done`` and every event this
  parser does not know are liveness only (``function_call_arguments.done`` brings the
  whole arguments only for a call none of whose fragments came, as some servers send it).
- The end markers: ``response.completed`` (finish ``"stop"``, or ``"tool_calls"`` when the
  model called a function, with the usage of the whole response); ``response.incomplete``
  (``"length"`` when it ran out of ``max_output_tokens``; the content filter or any other
  reason fails); ``response.failed`` and ``error`` fail, retryable before any visible text
  and ``partial`` after it. A refusal streamed as ``response.refusal.delta`` fails at the end,
  not retried, naming what the model said.

``sequence`` is the last event consumed, the resume point of a background response (an
``on_read`` callable, if set, is handed each read's deltas once the read is parsed, before
they go anywhere: the adapter reports checkpoints there, deltas or not); a
parser resuming a response skips events it already has (a server replaying too much). A
resumed response the replay says is ``failed`` / ``cancelled`` / ``expired`` before any
new delta is :class:`ResponseNotResumable`: the caller calls again instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from ai_lease.errors import EmptyEventStream, ProviderError
from ai_lease.providers.base import Completion, Delta, ToolCall, ToolCallDelta, Usage
from ai_lease.providers.chunks import stream_error

__all__ = ["ResponseNotResumable", "ResponsesParser", "completion_of", "response_usage"]

_loads = orjson.loads
_TEXT = "response.output_text.delta"
_GONE = frozenset({"failed", "cancelled", "expired"})


class ResponseNotResumable(ProviderError):
    """A background response that cannot be resumed (failed, cancelled, expired): call again."""

    def __init__(self, response_id: str, why: str, *, provider: str = "") -> None:
        self.response_id = response_id
        super().__init__(
            f"response {response_id!r} cannot be resumed ({why}): call the model again",
            retryable=True,
            provider=provider,
        )


class ResponsesParser:
    """The deltas of one Responses stream's event payloads, read by read (module docstring).

    >>> parser = ResponsesParser("openai-responses")
    >>> parser.deltas([b'{"type":"response.output_text.delta","delta":"Hi","sequence_number":3}'])
    [Delta(text='Hi', finish_reason=None, usage=None, reasoning='', tool_calls=())]
    >>> parser.sequence
    3
    """

    __slots__ = (
        "calls",
        "chunks",
        "emitted",
        "error",
        "events",
        "finished",
        "floor",
        "on_read",
        "provider",
        "refusal",
        "response_id",
        "resuming",
        "sequence",
        "stopped",
    )

    def __init__(
        self,
        provider: str,
        *,
        response_id: str | None = None,
        after: int = -1,
        resumed_text: bool = False,
    ) -> None:
        self.provider = provider
        self.response_id = response_id  # known at once when resuming, else from response.created
        self.resuming = response_id is not None
        self.sequence = after  # the last event consumed (-1: none yet)
        self.floor = after if self.resuming else None  # a resume skips what it already has
        self.chunks = 1 if resumed_text else 0  # text deltas (``partial`` of an error)
        self.events = 0
        self.emitted = False  # a delta was handed over (a resume can no longer fall back)
        self.finished = False
        self.stopped = False
        self.error: ProviderError | None = None
        self.calls: dict[int, list[Any]] = {}  # output_index -> [call_id, name, argument pieces]
        self.refusal: list[str] = []
        self.on_read: Callable[[list[Delta]], None] | None = None

    def deltas(self, payloads: list[bytes]) -> list[Delta]:
        """The deltas of one read's payloads, up to an end marker or an error."""
        self.events += len(payloads)
        out: list[Delta] = []
        for data in payloads:
            try:
                obj = _loads(data)
                kind = obj["type"]
                seq = obj.get("sequence_number")
                if self.floor is not None and seq is not None and seq <= self.floor:
                    continue  # a server replaying too much: consumed before the checkpoint
                if kind == _TEXT:  # once per streamed token
                    text = obj["delta"]
                    if text.__class__ is not str:
                        raise TypeError(text)
                    if text:
                        self.chunks += 1
                        out.append(Delta(text))
                else:
                    self.emitted = self.emitted or bool(out)  # a resume falls back only before
                    handler = _HANDLERS.get(kind)
                    delta = handler(self, obj) if handler is not None else None
                    if delta is not None:
                        out.append(delta)
            except ProviderError as exc:
                self.error, self.stopped = exc, True
                break
            except (ValueError, LookupError, TypeError, AttributeError):
                message = f"malformed event: {data[:80]!r}"
                self.error, self.stopped = stream_error(self.provider, message, self.chunks), True
                break
            if seq.__class__ is int:
                self.sequence = seq
            if self.stopped:
                break
        if out:
            self.emitted = True
        if self.on_read is not None:
            self.on_read(out)
        return out

    def end(self) -> None:
        """Once stopped: the error that stopped the stream, if any; nothing for a whole one."""
        if self.error is not None:
            raise self.error

    def cut(self) -> ProviderError:
        """The body ended before ``response.completed`` (or no event came at all)."""
        if not self.events:
            return EmptyEventStream(provider=self.provider)
        message = "the stream ended before response.completed (a cut connection?)"
        return stream_error(self.provider, message, self.chunks)

    # -- the events that are not text ---------------------------------------------------

    def _started(self, obj: Mapping[str, Any]) -> None:
        """``response.created`` / ``queued`` / ``in_progress``: the response's id and status."""
        response = obj["response"]
        self.response_id = response.get("id") or self.response_id
        status = response.get("status")
        if self.resuming and status in _GONE and not self.emitted:
            raise ResponseNotResumable(str(self.response_id), status, provider=self.provider)

    def _item_added(self, obj: Mapping[str, Any]) -> Delta | None:
        """A function call's id and name (liveness: no arguments yet)."""
        item = obj["item"]
        if item.get("type") != "function_call":
            return None
        index = int(obj["output_index"])
        self.calls[index] = [item.get("call_id"), item.get("name"), 0]
        return Delta(tool_calls=(ToolCallDelta(index, item.get("call_id"), item.get("name")),))

    def _arguments(self, obj: Mapping[str, Any]) -> Delta | None:
        """One fragment of a function call's arguments."""
        piece = obj["delta"]
        if piece.__class__ is not str:
            raise TypeError(piece)
        index = int(obj["output_index"])
        call = self.calls.setdefault(index, [None, None, 0])
        call[2] += len(piece)
        return Delta(tool_calls=(ToolCallDelta(index, call[0], call[1], piece),)) if piece else None

    def _arguments_done(self, obj: Mapping[str, Any]) -> Delta | None:
        """The whole arguments, used only when no fragment of them came (some servers)."""
        index = int(obj["output_index"])
        call = self.calls.setdefault(index, [None, obj.get("name"), 0])
        whole = obj.get("arguments") or ""
        if call[2] or not isinstance(whole, str) or not whole:
            return None
        call[2] = len(whole)
        return Delta(tool_calls=(ToolCallDelta(index, call[0], call[1] or obj.get("name"), whole),))

    def _reasoning(self, obj: Mapping[str, Any]) -> Delta | None:
        piece = obj["delta"]
        if piece.__class__ is not str:
            raise TypeError(piece)
        return Delta(reasoning=piece) if piece else None

    def _refusal(self, obj: Mapping[str, Any]) -> None:
        self.refusal.append(str(obj.get("delta") or ""))

    def _completed(self, obj: Mapping[str, Any]) -> Delta:
        response = obj["response"]
        if self.refusal:
            said = "".join(self.refusal)[:200]
            raise ProviderError(
                f"the model refused: {said!r}", retryable=False, provider=self.provider
            )
        calls = self.calls or any(
            isinstance(item, dict) and item.get("type") == "function_call"
            for item in response.get("output") or ()
        )
        self.finished = self.stopped = True
        return Delta(finish_reason="tool_calls" if calls else "stop", usage=_usage(response))

    def _incomplete(self, obj: Mapping[str, Any]) -> Delta:
        response = obj["response"]
        reason = (response.get("incomplete_details") or {}).get("reason")
        if reason == "max_output_tokens":
            self.finished = self.stopped = True
            return Delta(finish_reason="length", usage=_usage(response))
        if reason == "content_filter":
            raise ProviderError(
                "the answer was stopped by the content filter (response.incomplete)",
                retryable=False,
                provider=self.provider,
            )
        raise stream_error(self.provider, f"the response is incomplete: {reason}", self.chunks)

    def _failed(self, obj: Mapping[str, Any]) -> None:
        response = obj["response"]
        if self.resuming and not self.emitted:
            rid = str(response.get("id") or self.response_id)
            raise ResponseNotResumable(rid, "it failed", provider=self.provider)
        error = response.get("error") or {}
        message = f"response.failed: {error.get('code')}: {error.get('message')}"
        raise stream_error(self.provider, message, self.chunks)

    def _error(self, obj: Mapping[str, Any]) -> None:
        message = f"error in stream: {obj.get('code')}: {obj.get('message')}"
        raise stream_error(self.provider, message, self.chunks)


def _usage(response: Mapping[str, Any]) -> Usage | None:
    return response_usage(response.get("usage"))


def response_usage(data: Mapping[str, Any] | None) -> Usage | None:
    """A Responses ``usage`` object (input / output / reasoning tokens) as a :class:`Usage`."""
    if not data:
        return None
    details = data.get("output_tokens_details") or {}
    return Usage(
        int(data.get("input_tokens") or 0),
        int(data.get("output_tokens") or 0),
        int(details.get("reasoning_tokens") or 0),
    )


def completion_of(provider: str, content: bytes) -> Completion:
    """A whole response object as a :class:`Completion` (its status decides the finish)."""
    try:
        data = orjson.loads(content)
        texts, calls, refusals = _output_of(data.get("output") or ())
        usage = response_usage(data.get("usage"))
        status = data.get("status")
        reason = (data.get("incomplete_details") or {}).get("reason")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise stream_error(provider, f"not a response: {content[:80]!r}", 0) from None
    if refusals:
        message = f"the model refused: {refusals[:200]!r}"
        raise ProviderError(message, retryable=False, provider=provider)
    if status in ("completed", None):
        return Completion(texts, "tool_calls" if calls else "stop", usage, tool_calls=calls)
    if status == "incomplete" and reason == "max_output_tokens":
        return Completion(texts, "length", usage, tool_calls=calls)
    if status == "incomplete" and reason == "content_filter":
        message = "the answer was stopped by the content filter (response incomplete)"
        raise ProviderError(message, retryable=False, provider=provider)
    error = data.get("error") or {}
    detail = reason if status == "incomplete" else f"{error.get('code')}: {error.get('message')}"
    # failed / incomplete: the provider's trouble, worth another try; anything else
    # (queued, in_progress, cancelled) is not an answer this call can wait for
    retryable = status in ("failed", "incomplete")
    raise ProviderError(f"response {status}: {detail}", retryable=retryable, provider=provider)


def _output_of(output: Sequence[Any]) -> tuple[str, tuple[ToolCall, ...], str]:
    """``(text, tool calls, refusal)`` of a response's output items."""
    texts, refusals, calls = [], [], []
    for item in output:
        kind = item.get("type")
        if kind == "function_call":
            calls.append(ToolCall(item["call_id"], item["name"], item.get("arguments") or ""))
        elif kind == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    refusals.append(str(part.get("refusal") or ""))
    return "".join(texts), tuple(calls), "".join(refusals)


_Handler = Callable[[ResponsesParser, Any], Delta | None]
_HANDLERS: dict[str, _Handler] = {
    "response.created": ResponsesParser._started,
    "response.queued": ResponsesParser._started,
    "response.in_progress": ResponsesParser._started,
    "response.output_item.added": ResponsesParser._item_added,
    "response.function_call_arguments.delta": ResponsesParser._arguments,
    "response.function_call_arguments.done": ResponsesParser._arguments_done,
    "response.reasoning_summary_text.delta": ResponsesParser._reasoning,
    "response.reasoning_text.delta": ResponsesParser._reasoning,
    "response.refusal.delta": ResponsesParser._refusal,
    "response.completed": ResponsesParser._completed,
    "response.incomplete": ResponsesParser._incomplete,
    "response.failed": ResponsesParser._failed,
    "error": ResponsesParser._error,
}
