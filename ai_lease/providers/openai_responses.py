"""``openai-responses``: a lean streaming client of OpenAI's Responses API, resumable.

``POST {base_url}/responses`` with ``stream: true``; the named events are parsed by
:mod:`~ai_lease.providers.responses_events` (what is progress, what is liveness, the end
markers). The neutral chat request is translated here: leading system messages become
``instructions`` (a later one a ``developer`` message), text and image parts become
``input_text`` / ``input_image``, an assistant's tool calls ``function_call`` items and tool
answers ``function_call_output`` items; function tools are flattened (``{"type":
"function", "name", "description", "parameters"}``), ``response_format`` becomes
``text.format`` and ``max_tokens`` ``max_output_tokens``. The Responses API has no stop
sequences: a request with ``stop`` is refused.

**Background mode and resuming.** With ``background=True`` the response runs on OpenAI's
side whether or not anyone is connected (``store`` must then be true: it is sent so), and a
stream can be picked up again. After each network read that moved the stream the adapter
calls ``request.on_checkpoint(Checkpoint(name, response_id, sequence))`` — before handing the
batch over, with no ``await`` between, so what the caller has collected when it looks and
the checkpoint agree (``text`` is left empty: the caller pairs it with its own). The first
comes with ``response.created``, before any delta: a response that thinks silently is
resumable too (a call retried after a first-token timeout picks it up, never creates a
second one). A response the caller gives up is cancelled with :meth:`cancel_response`
(``POST {base_url}/responses/{id}/cancel``; the caller bounds it). A request
whose ``resume`` is such a checkpoint (with the visible text up to it) is not sent again:
``GET {base_url}/responses/{id}?stream=true&starting_after={sequence}`` replays the rest,
and the first batch starts with one delta carrying the checkpoint's text and reasoning, so
the collected answer is the whole answer exactly once. A response the provider says is gone
(404 / 410) or failed / cancelled / expired is called again instead, with a warning in the
log; nothing of the old text is handed over then.

Limits: a checkpoint carries text, not tool-call fragments, so a function call whose
arguments were half streamed at the checkpoint resumes with its tail only (and no id/name).
``complete()`` (not streamed) never runs in the background.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Unpack
from urllib.parse import quote

import httpx
import orjson
from pydantic import SecretStr

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers.base import ChatRequest, Checkpoint, Completion, Delta
from ai_lease.providers.errors import status_error
from ai_lease.providers.headers import with_extra
from ai_lease.providers.openai_compat import (
    _api_key,
)
from ai_lease.providers.request_ids import new_request_id
from ai_lease.providers.responses_events import (
    ResponseNotResumable,
    ResponsesParser,
    completion_of,
)
from ai_lease.providers.streaming import (
    HTTPStreamProvider,
    StreamOptions,
    model_of,
    sampling_fields,
)

__all__ = ["OpenAIResponsesProvider", "input_items", "responses_body"]

log = logging.getLogger("ai_lease.providers.openai_responses")
_GONE_STATUS = frozenset({404, 410})


# -- the request ---------------------------------------------------------------------


def responses_body(
    request: ChatRequest,
    default_model: str | None,
    *,
    stream: bool,
    defaults: Mapping[str, Any] | None = None,
    background: bool = False,
    store: bool | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /responses`` for ``request`` (``defaults``: the provider's
    ``temperature`` / ``max_tokens``, for what the request leaves unset)."""
    model = model_of(request, default_model)
    if request.stop:
        raise ConfigError(
            "job.stop: the Responses API has no stop sequences; drop `stop` or use "
            "the openai-compatible provider"
        )
    instructions, items = input_items(request.messages)
    body: dict[str, Any] = {"model": model, "input": items}
    if instructions:
        body["instructions"] = instructions
    body.update(sampling_fields(request, defaults, "max_output_tokens"))
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.response_format:
        body["text"] = {"format": _text_format(request.response_format)}
    if stream:
        body["stream"] = True
    if background:
        body["background"] = body["store"] = True
    elif store is not None:
        body["store"] = store
    body.update(request.extra)
    return body


def input_items(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """``(instructions, input items)`` of neutral chat messages (see the module docstring)."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer") and not items:
            instructions.append(_plain_text(message.get("content")))
        elif role in ("system", "developer"):
            items.append({"role": "developer", "content": _plain_text(message.get("content"))})
        elif role == "tool":
            output = message.get("content")
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.get("tool_call_id"),
                    "output": output if isinstance(output, str) else _plain_text(output),
                }
            )
        elif role == "assistant":
            items += _assistant_items(message)
        else:
            items.append({"role": role or "user", "content": _content(message.get("content"))})
    return "\n\n".join(part for part in instructions if part), items


def _assistant_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant turn: its text as a message, each tool call as a ``function_call`` item."""
    out: list[dict[str, Any]] = []
    if text := _plain_text(message.get("content")):
        out.append({"role": "assistant", "content": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        out.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            }
        )
    return out


def _content(content: Any) -> Any:
    """A user message's content: a text as is, parts as ``input_text`` / ``input_image``."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "input_text", "text": part.get("text", "")})
        elif kind == "image_url":
            image = part.get("image_url")
            url, detail = (
                (image, None) if isinstance(image, str) else (image["url"], image.get("detail"))
            )
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        else:
            parts.append(dict(part))  # already a Responses part (input_file, …): as given
    return parts


def _plain_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions tool flattened; a tool of another kind (web_search…) as given."""
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        return dict(tool)
    return {"type": "function", **function}


def _tool_choice(choice: str | Mapping[str, Any]) -> Any:
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _text_format(response_format: Mapping[str, Any]) -> dict[str, Any]:
    """``response_format`` as ``text.format``: a JSON schema's fields come up one level."""
    if response_format.get("type") == "json_schema":
        return {"type": "json_schema", **(response_format.get("json_schema") or {})}
    return dict(response_format)


# -- the provider --------------------------------------------------------------------


class OpenAIResponsesProvider(HTTPStreamProvider):
    """Streams OpenAI Responses from ``base_url`` (default OpenAI's), resumable in the
    background (see the module's docstring).

    >>> provider = OpenAIResponsesProvider(api_key="sk-…", model="gpt-5-mini", background=True)
    """

    name = "openai-responses"
    sends_client_id = True

    def __init__(
        self,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | SecretStr | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        background: bool = False,
        store: bool | None = None,
        **options: Unpack[StreamOptions],
    ) -> None:
        if background and store is False:
            raise ConfigError(
                "provider.store: background responses are stored by OpenAI "
                "(store = false cannot be background); drop one of the two"
            )
        key = _api_key(api_key, base_url)
        super().__init__(
            base_url=base_url,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            **options,
        )
        self.background, self.store = background, store
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}

    def __repr__(self) -> str:  # never shows the key
        return (
            f"OpenAIResponsesProvider(url={self._base!r}, model={self.model!r}, "
            f"http={self.http!r}, background={self.background!r})"
        )

    def stream_request(self, request: ChatRequest) -> tuple[str, bytes | None, dict[str, str]]:
        resume = self._resume_of(request)
        if resume is not None:
            rid = quote(resume.response_id, safe="")
            url = f"{self._base}/responses/{rid}?stream=true&starting_after={resume.sequence}"
            return url, None, self._request_headers(request)
        body = responses_body(
            request,
            self.model,
            stream=True,
            defaults=self.defaults,
            background=self.background,
            store=self.store,
        )
        return f"{self._base}/responses", orjson.dumps(body), self._post_headers(request)

    def parser(self) -> ResponsesParser:
        return ResponsesParser(self.name)

    async def stream_batches(self, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
        """The base's batches, with checkpoints reported and a resume tried first."""
        resume = self._resume_of(request)
        if resume is not None:
            handed = False  # a delta was handed over: too late to call again
            try:
                async with contextlib.aclosing(self._batches(request, resume)) as batches:
                    async for batch in batches:
                        handed = handed or bool(batch)
                        yield batch
                return
            except ProviderError as exc:
                gone = isinstance(exc, ResponseNotResumable) or exc.status in _GONE_STATUS
                if handed or not gone:
                    raise
                why = str(exc)
            fresh = new_request_id() if request.request_id else None  # one per HTTP request
            log.warning(
                "response %s not resumed (%s): calling the model again (X-Request-Id %s)",
                resume.response_id,
                why,
                fresh,
            )
            request = replace(request, resume=None, request_id=fresh)
        async with contextlib.aclosing(self._batches(request, None)) as batches:
            async for batch in batches:
                yield batch

    async def _batches(
        self, request: ChatRequest, resume: Checkpoint | None
    ) -> AsyncGenerator[list[Delta], None]:
        """One stream through the base's loop, with this stream's own parser (it knows the
        checkpoint it resumes), its checkpoints reported before each batch is handed on."""
        parser = ResponsesParser(
            self.name,
            response_id=resume.response_id if resume else None,
            after=resume.sequence if resume else -1,
            resumed_text=bool(resume and resume.text),
        )
        head = Delta(resume.text, reasoning=resume.reasoning) if resume else None
        if head is not None and not (head.text or head.reasoning):
            head = None
        if self.background and request.on_checkpoint is not None:
            parser.on_read = _reporter(parser, request.on_checkpoint, waiting=head is not None)
        inner = self.read_stream(request, parser)
        async with contextlib.aclosing(inner):
            batch: list[Delta] | None = await anext(inner, None)
            while batch is not None:
                if batch and head is not None:
                    batch, head = [head, *batch], None
                yield batch
                batch = await anext(inner, None)

    def _resume_of(self, request: ChatRequest) -> Checkpoint | None:
        """The checkpoint to resume, when this provider can resume it."""
        resume = request.resume
        if resume is None or not self.background or resume.provider != self.name:
            return None
        return resume

    async def cancel_response(self, response_id: str) -> str:
        """Cancel a background response the caller gave up (``POST …/responses/{id}/cancel``)
        and say what came of it; a failure is said, never raised (the caller bounds it)."""
        url = f"{self._base}/responses/{quote(response_id, safe='')}/cancel"
        headers = with_extra(self._headers, self._extra)
        try:
            answer = await self._client.post(url, headers=headers)
        except httpx.HTTPError as exc:
            return f"not cancelled: {type(exc).__name__}: {exc}"[:300]
        if answer.status_code >= 300:
            error = status_error(self.name, answer.status_code, answer.content, answer.headers)
            return f"not cancelled: {error}"[:300]
        try:
            status = orjson.loads(answer.content).get("status")
        except (orjson.JSONDecodeError, AttributeError):
            status = None
        return f"cancelled (status {status})" if status else "cancelled"

    async def complete(self, request: ChatRequest) -> Completion:
        """One whole response, not streamed (never in the background)."""
        body = responses_body(
            request, self.model, stream=False, defaults=self.defaults, store=self.store
        )
        content = await self.post_json(f"{self._base}/responses", orjson.dumps(body), request)
        return completion_of(self.name, content)


def _reporter(
    parser: ResponsesParser, report: Callable[[Checkpoint], None], *, waiting: bool
) -> Callable[[list[Delta]], None]:
    """The parser's ``on_read``: report the stream's checkpoint after each read that moved it
    (from ``response.created`` on), before that read's deltas are handed on. A resume still
    ``waiting`` to hand its checkpoint's text over (it goes with the first deltas) reports
    none before: the checkpoint and what the caller collected must agree."""
    reported = parser.sequence

    def on_read(out: list[Delta]) -> None:
        nonlocal reported, waiting
        waiting = waiting and not out
        if not waiting and parser.response_id and parser.sequence > reported:
            reported = parser.sequence
            report(Checkpoint(parser.provider, parser.response_id, reported))

    return on_read
