"""The five default stages: load → build_prompt → call_ai → parse → persist.

``load`` takes the job's input (as the submitter read it), ``build_prompt`` renders the
job's template into a request, ``call_ai`` calls the model (streamed under the stream guard,
transient failures retried within the stage's deadline: :data:`~ai_lease.retry.MODEL_CALL`),
``parse`` turns the answer into text or JSON, and ``persist`` commits it, fenced. Each is a
plain ``async`` function of a :class:`~ai_lease.run.context.StageContext`: replace one with
``Pipeline.default().replace(name, Stage(name, fn))``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import orjson

from ai_lease.errors import EmptyAnswer, JobSpecError, ProviderError, StageTimeout
from ai_lease.job import Job
from ai_lease.job_shapes import image_parts
from ai_lease.lease.base import CHECKPOINT_LIMIT
from ai_lease.lease.classify import describe
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import ChatRequest, Checkpoint, Completion, Provider
from ai_lease.providers.request_ids import client_request_id, new_request_id
from ai_lease.retry import call_with_retries
from ai_lease.run.background import cancel_left, cancelling_abandoned, retry_point
from ai_lease.run.call_notes import call_detail, noting_call
from ai_lease.run.empty_answer import capped, empty_answer_why
from ai_lease.run.slot_call import holding_slots
from ai_lease.run.stream_guard import StreamGuard

if TYPE_CHECKING:
    from ai_lease.providers.base import ToolCall
    from ai_lease.run.context import StageContext

__all__ = [
    "CAPPED_NOTE",
    "build_prompt",
    "call_ai",
    "load",
    "parse",
    "persist",
    "read_input",
    "render_request",
    "rendered",
    "tool_message",
]

log = logging.getLogger("ai_lease.runner")

CAPPED_NOTE = (
    "the model stopped at max_tokens (finish_reason length): the answer is whole but capped; "
    "raise max_tokens for a longer one"
)


async def read_input(job: Job) -> Any:
    """The job's input: ``job.input``. A job still naming an ``input_file`` is refused: the
    submitter reads the file (:func:`ai_lease.inputs.resolve_input`), a worker never opens
    a path it was handed."""
    if job.input_file is not None:
        raise JobSpecError(
            f"job {job.key!r}: input_file {job.input_file!r} was not read by its submitter; "
            "a worker never opens a path it was handed (Runner.run and submit read it)"
        )
    return job.input


def render_request(job: Job, prompts: PromptLibrary, data: Any) -> ChatRequest:
    """Render the job's template with ``input`` and the job's variables into a request
    (in the calling thread, under the library's render deadline: call it off the loop).
    A job with no input renders without ``input``: a template that uses it is refused.
    The job's ``images`` follow the text as image parts of the user message; its tools,
    tool choice and response format go with the request."""
    variables = {**job.variables, "input": data} if data is not None else {**job.variables}
    if job.prompt_text is not None:
        text = prompts.render_text(job.prompt_text, variables)
    else:
        text = prompts.render(job.prompt, variables)
    content: str | list[dict[str, Any]] = image_parts(text, job.images) if job.images else text
    messages = ([{"role": "system", "content": job.system}] if job.system else []) + [
        {"role": "user", "content": content}
    ]
    return ChatRequest(
        messages,
        job.model,
        job.temperature,
        job.max_tokens,
        tools=job.tools,
        tool_choice=job.tool_choice,
        response_format=job.response_format,
    )


async def load(ctx: StageContext) -> Any:
    """The job's input: ``job.input``, or the text of ``job.input_file`` (as the preflight
    read it, when this node ran one)."""
    if "load" in ctx._run.prepared:
        return ctx._run.prepared["load"]
    return await read_input(ctx.job)


async def build_prompt(ctx: StageContext) -> ChatRequest:
    """Render the job's template with ``input`` and the job's variables into a request
    (the preflight's rendering, when it rendered this very input)."""
    data = ctx.output("load")
    if "build_prompt" in ctx._run.prepared and data is ctx._run.prepared.get("load"):
        return cast(ChatRequest, ctx._run.prepared["build_prompt"])
    return await rendered(ctx.job, ctx._run.prompts, data)


async def rendered(job: Job, prompts: PromptLibrary, data: Any) -> ChatRequest:
    """:func:`render_request`, on the loop for a plain inline template (text and variable
    lookups only: as cheap as copying its input), else in a thread under the render
    deadline (a template file, or one that may loop)."""
    if job.prompt_text is not None and prompts.is_plain(job.prompt_text):
        return render_request(job, prompts, data)
    return await asyncio.to_thread(render_request, job, prompts, data)


async def call_ai(ctx: StageContext) -> Completion:
    """Call the model: streamed under the stream guard (every text, reasoning or
    tool-argument fragment is progress), or in one response under the stage's hard
    deadline; transient failures are retried within that deadline. Each call sends a fresh
    UUID as ``X-Request-Id`` and ``<key>:<token>:<n>`` as the client id, both noted in the
    job's timeline (:mod:`~ai_lease.run.call_notes`). A stream an earlier owner left a checkpoint of
    (same provider) is resumed, not requested again; if resuming fails, a fresh call."""
    provider = ctx._run.provider
    if provider is None:
        raise JobSpecError(f"job {ctx.job.key!r}: no provider to call")
    request: ChatRequest = ctx.output("build_prompt")
    resume = (
        resume_point(ctx._run.resume_from, provider.name, ctx.job.key) if ctx.job.stream else None
    )
    sent: list[str] = []  # each call's X-Request-Id

    async def once() -> Completion:
        nonlocal resume
        point, resume = resume, None  # the stored checkpoint: the first call's only
        if point is None and (again := retry_point(ctx, provider)) is not None:
            return await _call(ctx, provider, request, again, sent)  # a retry resumes its own
        if point is not None:
            try:
                return await _call(ctx, provider, request, point, sent)
            except ProviderError as exc:  # the response is gone, failed, or will not resume
                log.warning(
                    "job %r: resuming %s failed (%s): calling afresh",
                    ctx.job.key,
                    point.response_id,
                    exc,
                )
                ctx.say("resume_failed", str(exc), attrs={"provider": provider.name})
                await cancel_left(ctx, provider, point, exc)  # replaced by a fresh call
        return await _call(ctx, provider, request, None, sent)

    calls = call_with_retries(
        once,
        ctx._run.call_retry,
        deadline_at=ctx._run.deadline_at,
        on_retry=lambda exc, wait: _retrying(ctx, exc, wait),
    )
    completion = await cancelling_abandoned(ctx, provider, calls)  # a response given up: cancelled
    _report(ctx, provider, completion, _model(request, provider), sent[-1])
    _record(ctx, provider, request, completion)
    ctx._run.finish_reason = completion.finish_reason
    if not (completion.tool_calls or completion.text.strip() or ctx.job.allow_empty):
        reasoned = ctx._run.guard is not None and ctx._run.guard.reasoning_chars > 0
        why = empty_answer_why(completion, capped(request, provider), reasoned=reasoned)
        raise EmptyAnswer(why, provider=provider.name)
    if completion.finish_reason == "length":  # a whole answer, but capped: say so
        ctx.say("answer_capped", CAPPED_NOTE, attrs={"finish_reason": "length"})
    return completion


async def _streamed(ctx: StageContext, provider: Provider, request: ChatRequest) -> Completion:
    """One streamed call under the stream guard; its timeouts and gaps are reported. A
    resumed stream is whole by itself: the provider hands back the checkpoint's text first,
    then what follows it (:class:`~ai_lease.providers.base.Checkpoint`)."""
    guard = StreamGuard(
        ctx._run.stream_timeouts,
        ctx.tracker,
        limits=ctx._run.stream_limits,
        # said as the first content arrives, so a watcher sees it while the answer streams
        on_first_token=lambda s: _first_token(ctx, provider, s),
        # φ over the gaps between progress reached the threshold: said once per stream
        on_suspected=lambda phi, silence: ctx.say(
            "progress_suspected",
            provider.name,
            value=phi,
            attrs={"provider": provider.name, "silence_s": round(silence, 3)},
        ),
    )
    ctx._run.checkpoint, ctx._run.guard = request.resume, guard  # the keeper's source, from now on
    try:
        return await guard.call(provider, request)
    except StageTimeout as exc:
        # Stopped (SIGSTOP) past the lease, the idle budget ran out meanwhile too: the lost
        # lease is the reason, said once by the keeper; the stream's timeout is its cause.
        if (lost := ctx.lease_lapsed()) is not None:
            raise lost from exc
        ctx.say(
            "stream_timeout",
            type(exc).__name__,
            value=exc.budget_s,
            attrs={"provider": provider.name},
        )
        raise
    finally:
        if guard.chunks > 1:
            ctx.say("stream_gap", provider.name, value=guard.max_gap_s)
        if guard.first_visible_s is not None:  # after any reasoning: learned apart
            ctx._run.ran["first_visible_s"] = guard.first_visible_s
            ctx.say("first_visible", provider.name, value=guard.first_visible_s)


async def _call(
    ctx: StageContext,
    provider: Provider,
    request: ChatRequest,
    resume: Checkpoint | None,
    sent: list[str],
) -> Completion:
    """One model call (the ``n``-th of the attempt), on a live lease only: a side effect.
    Its ids (a fresh UUID, the job's correlation) go with it and into the timeline. Under
    ``[limits]`` it holds a slot of each matching limit first (:mod:`~ai_lease.run.slot_call`)."""
    if ctx._run.limits:
        async with holding_slots(ctx, provider, _model(request, provider), request) as use:
            completion = await _send(ctx, provider, request, resume, sent)
            use.spent(completion.usage)  # a tpm window counts what the answer spent
            return completion
    return await _send(ctx, provider, request, resume, sent)


async def _send(
    ctx: StageContext,
    provider: Provider,
    request: ChatRequest,
    resume: Checkpoint | None,
    sent: list[str],
) -> Completion:
    ctx.ensure_lease()
    ctx._run.calls += 1
    fence, n, rid = ctx.fence, ctx._run.calls, new_request_id()
    client_id = client_request_id(fence.key, fence.token, n)
    request = replace(request, request_id=rid, client_request_id=client_id)
    sent.append(rid)
    detail = call_detail(n, rid, client_id, provider.name, _model(request, provider))
    ctx.say("model_request", rid, attrs={"request_id": rid, "client_request_id": client_id})
    async with noting_call(ctx._run.store, fence, ctx.tracker.stage, detail, ctx._run.notes):
        if not ctx.job.stream:
            return await provider.complete(request)
        if resume is not None:
            ctx.say("resumed", resume.response_id, attrs={"sequence": resume.sequence})
        request = replace(request, resume=resume, on_checkpoint=ctx.note_checkpoint)
        return await _streamed(ctx, provider, request)


def _model(request: ChatRequest, provider: Provider) -> str | None:
    """The model a call names: the request's, else the provider's (when it says one)."""
    model = request.model or getattr(provider, "model", None)
    return model if isinstance(model, str) else None


def resume_point(raw: str | None, provider: str, key: str) -> Checkpoint | None:
    """The checkpoint a record holds, if ``provider`` can resume it: None without one, for
    another provider's, and (with a warning) for one that is malformed or too large."""
    if raw is None:
        return None
    problem, point = _parsed_checkpoint(raw)
    if problem is not None:
        log.warning("job %r: stored checkpoint ignored (%s): calling afresh", key, problem)
        return None
    assert point is not None
    return point if point.provider == provider else None


def _parsed_checkpoint(raw: str) -> tuple[str | None, Checkpoint | None]:
    """(what is wrong, None) or (None, the checkpoint) for a stored checkpoint's JSON."""
    if len(raw) > CHECKPOINT_LIMIT:
        return f"{len(raw)} characters, over {CHECKPOINT_LIMIT}", None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "not JSON", None
    if not isinstance(data, dict):
        return "not a JSON object", None
    provider, response_id = data.get("provider"), data.get("response_id")
    sequence, text = data.get("sequence"), data.get("text", "")
    if not (isinstance(provider, str) and provider and isinstance(response_id, str)):
        return "no provider or response_id", None
    if not response_id or isinstance(sequence, bool) or not isinstance(sequence, int):
        return "no response_id or sequence", None
    if sequence < 0 or not isinstance(text, str):
        return "a negative sequence or a text that is not a string", None
    return None, Checkpoint(provider, response_id, sequence, text=text)


def _retrying(ctx: StageContext, exc: BaseException, wait: float) -> None:
    """A call failed and is made again after ``wait`` seconds: said (never progress)."""
    attrs: dict[str, float | int | str] = {
        "error": type(exc).__name__,
        "calls": ctx._run.calls,
        "wait_s": round(wait, 3),
    }
    ctx.say("call_retry", f"in {wait:.1f} s after {describe(exc)[:240]}", attrs=attrs)


def _first_token(ctx: StageContext, provider: Provider, seconds: float) -> None:
    ctx._run.ran["first_token_s"] = seconds  # kept in the record
    ctx.say("first_token", provider.name, value=seconds)


def _record(
    ctx: StageContext, provider: Provider, request: ChatRequest, completion: Completion
) -> None:
    """What ran, for the record the commit writes: provider, model and token usage
    (reasoning tokens, part of the completion's, told apart)."""
    usage = completion.usage
    ctx._run.ran.update(provider=provider.name, model=_model(request, provider))
    if usage is not None:
        ctx._run.ran.update(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )


def _report(
    ctx: StageContext,
    provider: Provider,
    completion: Completion,
    model: str | None,
    request_id: str,
) -> None:
    usage = completion.usage
    ctx.say(
        "model_call",
        provider.name,
        attrs={
            "provider": provider.name,
            "model": model or "",
            "request_id": request_id,
            "chunks": completion.chunks,
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "reasoning_tokens": usage.reasoning_tokens if usage else 0,
            "tool_calls": len(completion.tool_calls),
            "finish_reason": completion.finish_reason or "",
        },
    )


async def parse(ctx: StageContext) -> Any:
    """The answer as text, exactly as the model sent it (whitespace included: nothing is
    trimmed), or as a JSON value when the job's output is ``json`` (that parse trims the
    blanks and a Markdown code fence around the value). An answer
    with tool calls is the assistant message (``role``, ``content``, ``tool_calls`` in
    OpenAI's shape); a ``json`` job checks that each call's arguments are JSON. (A
    ``json_schema`` response format is the provider's to enforce: the answer is checked to
    be JSON, not checked against the schema; no schema validator is a dependency.)"""
    completion: Completion = ctx.output("call_ai")
    if completion.tool_calls:
        if ctx.job.output == "json":
            for index, call in enumerate(completion.tool_calls):
                _check_arguments(index, call)
        return tool_message(completion)
    if ctx.job.output == "text":
        return completion.text
    text = completion.text.strip()
    body = text.removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProviderError(
            f"the model's answer is not JSON ({exc}); first 80 characters: {text[:80]!r}",
            retryable=True,
        ) from None


def tool_message(completion: Completion) -> dict[str, Any]:
    """A tool-calling answer as the assistant message OpenAI's chat format sends back:
    ``content`` is the visible text, or None when the model only called tools."""
    return {
        "role": "assistant",
        "content": completion.text or None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in completion.tool_calls
        ],
    }


def _check_arguments(index: int, call: ToolCall) -> None:
    """A tool call's arguments must be one JSON value (an empty text is not)."""
    try:
        orjson.loads(call.arguments)
    except orjson.JSONDecodeError as exc:
        raise ProviderError(
            f"tool call {index} ({call.name!r}, id {call.id!r}): its arguments are not JSON "
            f"at offset {exc.pos} ({exc.msg}); first 80 characters: {call.arguments[:80]!r}",
            retryable=True,
        ) from None


async def persist(ctx: StageContext) -> Any:
    """Commit the parsed output as the job's one result (fenced, idempotent)."""
    value = ctx.output("parse")
    await ctx.commit(value)
    return value
