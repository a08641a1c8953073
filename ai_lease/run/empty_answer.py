"""What an answer with nothing in it means, said so the job's failure tells what to change.

An answer with no text (or only whitespace) and no tool call is never stored as a result
unless the job says ``allow_empty``: ``call_ai`` raises
:class:`~ai_lease.errors.EmptyAnswer` with :func:`empty_answer_why` as its message.
"""

from __future__ import annotations

from dataclasses import replace

from ai_lease.providers.base import ChatRequest, Completion, Provider

__all__ = ["capped", "empty_answer_why"]


def empty_answer_why(
    completion: Completion, request: ChatRequest, *, reasoned: bool = False
) -> str:
    """What an answer with no (or only blank) text and no tool call means, and what to
    change. ``reasoned``: reasoning arrived (the stream guard counted it), which tells
    where the budget went when the usage does not count reasoning tokens (Anthropic,
    Ollama, a server that sends no usage)."""
    cap = f"max_tokens={request.max_tokens}" if request.max_tokens else "its max_tokens"
    usage = completion.usage
    reasoned = reasoned or (usage is not None and usage.reasoning_tokens > 0)
    if completion.finish_reason == "length" and reasoned:
        return f"the model spent {cap} on reasoning and wrote no answer; raise max_tokens"
    if completion.finish_reason == "length":
        return f"the model wrote no answer before it reached {cap}; raise max_tokens"
    return (
        f"the model's answer is empty (finish reason {completion.finish_reason or 'none'!r}): "
        "nothing stored. A prompt beyond the model's context does this on some servers and "
        "gateways (shorten the input); set allow_empty = true if an empty answer is a result"
    )


def capped(request: ChatRequest, provider: Provider) -> ChatRequest:
    """``request`` with the token cap the call ran under: its own, else the provider's."""
    if request.max_tokens:
        return request
    defaults = getattr(provider, "defaults", None)
    cap = defaults.get("max_tokens") if isinstance(defaults, dict) else None
    return replace(request, max_tokens=cap) if isinstance(cap, int) else request
