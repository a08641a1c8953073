"""The provider protocol: how ai_lease talks to a model.

A provider streams a chat request as :class:`Delta` objects (text, reasoning and
tool-call fragments, then a finish reason, then usage), or completes it in one
:class:`Completion`. Providers take no ``timeout=``:
the stream guard and the stage deadline wrap them from outside.

>>> class Echo:
...     name = "echo"
...     async def stream(self, request):
...         yield Delta(text=request.messages[-1]["content"])
...         yield Delta(finish_reason="stop")
...     async def complete(self, request):
...         return Completion(text=request.messages[-1]["content"], finish_reason="stop")
...     async def aclose(self):
...         pass
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ai_lease.providers.request_ids import CLIENT_ID_HEADER, REQUEST_ID_HEADER, client_id_header

__all__ = [
    "BatchStreaming",
    "ChatRequest",
    "Checkpoint",
    "Completion",
    "Delta",
    "Provider",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "assemble_tool_calls",
]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a resumable stream stood: the provider's ``response_id``, the last event
    ``sequence`` consumed, and the visible ``text`` / ``reasoning`` received up to it.
    Kept in the job record at each renewal, fenced, so a new owner can resume the same
    response instead of paying for it twice.

    A provider handed one in ``ChatRequest.resume`` streams the whole answer: the
    checkpoint's ``text`` and ``reasoning`` first, then the events after ``sequence``. One
    that cannot resume (the response is gone or failed) raises :class:`ProviderError`
    before any delta, or calls afresh by itself; either way no text comes twice."""

    provider: str
    response_id: str
    sequence: int
    text: str = ""
    reasoning: str = ""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat request, provider-neutral, in OpenAI's chat shapes; each adapter translates.

    ``messages``: ``{"role", "content"}`` where content is a text or a list of parts
    (``{"type": "text", "text": …}``, ``{"type": "image_url", "image_url": {"url": …}}``);
    an assistant message may carry ``tool_calls``, a ``tool`` message a ``tool_call_id``.
    ``tools``: ``[{"type": "function", "function": {"name", "description", "parameters"}}]``;
    ``tool_choice``: ``"auto"`` / ``"none"`` / ``"required"`` or
    ``{"type": "function", "function": {"name": …}}``; ``response_format``:
    ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}``. ``request_id`` (a UUID, fresh per call) goes out as the
    ``X-Request-Id`` header; ``client_request_id`` (the job's correlation,
    ``<job key>:<token>:<call n>``) as ``X-Client-Request-Id`` on the OpenAI paths
    (:mod:`ai_lease.providers.request_ids`); never the prompt. ``resume`` is a checkpoint of
    an earlier owner's stream to resume; ``on_checkpoint`` receives a resumable stream's
    checkpoints.
    """

    messages: Sequence[Mapping[str, Any]]
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    stop: Sequence[str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # passed through to the provider
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    response_format: Mapping[str, Any] | None = None
    request_id: str | None = None
    resume: Checkpoint | None = None
    on_checkpoint: Callable[[Checkpoint], None] | None = field(default=None, compare=False)
    client_request_id: str | None = None

    def headers(self, *, client_id: bool = False) -> dict[str, str]:
        """The tracing headers: ``X-Request-Id`` when there is one (every adapter sends it),
        and with ``client_id`` (the OpenAI paths) ``X-Client-Request-Id``, made header-safe
        (ASCII, at most 512 characters) when a caller's value is not."""
        out = {REQUEST_ID_HEADER: self.request_id} if self.request_id else {}
        if client_id and self.client_request_id:
            out[CLIENT_ID_HEADER] = client_id_header(self.client_request_id)
        return out


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts; ``reasoning_tokens`` (thinking, where the provider counts it apart) is
    part of ``completion_tokens`` when the provider counts it so, and told apart here."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


class ToolCallDelta(NamedTuple):
    """A fragment of one tool call, as a stream sends it: ``index`` names the call; the
    first fragment usually brings ``id`` and ``name``, the next ones pieces of
    ``arguments`` (a JSON text, whole only at the end)."""

    index: int  # type: ignore[assignment]  # the wire name; shadows tuple.index()
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Delta(NamedTuple):
    """A piece of a streamed answer. ``text`` is the visible answer; ``reasoning`` a
    reasoning model's thinking (``reasoning_content`` / ``reasoning``), never part of the
    answer; ``tool_calls`` tool-call fragments. Progress is any non-empty ``text``,
    ``reasoning`` or tool-call ``arguments``; the rest is liveness only.

    A named tuple, not a dataclass: one is built per streamed token, and this is the
    cheapest immutable record Python has (~0.2 µs against ~0.36 µs). The defaults are
    shared constants: a text-only delta allocates nothing more than before.
    """

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole tool call the model made: ``arguments`` is the full JSON text it sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole answer."""

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    chunks: int = 0
    tool_calls: tuple[ToolCall, ...] = ()  # finish_reason "tool_calls": a whole answer


def assemble_tool_calls(fragments: Sequence[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """The whole tool calls of a stream's fragments, in ``index`` order."""
    calls: dict[int, tuple[str, str, list[str]]] = {}
    for part in fragments:
        id_, name, args = calls.get(part.index, ("", "", []))
        args.append(part.arguments)
        calls[part.index] = (part.id or id_, part.name or name, args)
    return tuple(
        ToolCall(id_, name, "".join(args)) for _, (id_, name, args) in sorted(calls.items())
    )


@runtime_checkable
class Provider(Protocol):
    """What the call_ai stage needs from a model."""

    name: str

    def stream(self, request: ChatRequest) -> AsyncIterator[Delta]: ...

    async def complete(self, request: ChatRequest) -> Completion: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class BatchStreaming(Protocol):
    """Optional, for speed: a provider that can hand over the deltas of one network read
    together. The stream guard then does its per-chunk bookkeeping once per read, and no
    coroutine is resumed per token; everything else about the stream is as ``stream()``.
    """

    def stream_batches(self, request: ChatRequest) -> AsyncIterator[Sequence[Delta]]: ...
