"""Tokens under a ``tpm`` limit, and what a success's headers say of the provider's limit.

A request is weighed before it is sent (:func:`estimate_tokens`) and again once its answer
says what it spent (:class:`TokenUse`); the headers of its answers are heard while it runs
(:class:`HeadersHeard`): a provider that says nothing is left pauses the call's limits until
its reset, for the whole fleet.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ai_lease.errors import StoreError
from ai_lease.lease.call_limits import CallLimit
from ai_lease.lease.slots import PAUSE_RANGE, SlotStore
from ai_lease.providers.rate_headers import spent_for

if TYPE_CHECKING:
    from ai_lease.providers.base import ChatRequest, Usage

__all__ = ["CHARS_PER_TOKEN", "HeadersHeard", "TokenUse", "estimate_tokens"]

log = logging.getLogger("ai_lease.slots")

CHARS_PER_TOKEN = 4
"""Characters of text per token, the usual rule for English (OpenAI's own): an estimate;
the answer's usage sets the count right afterwards."""

PER_MESSAGE = 4
"""Tokens each message costs beyond its text (its role and framing)."""

PER_IMAGE = 85
"""Tokens an image part is counted as (OpenAI's low-detail image)."""


def estimate_tokens(request: ChatRequest | None, max_tokens: int | None = None) -> int:
    """A request's tokens before it is sent, as a provider counts it against its
    tokens-per-minute: its messages' and tools' text at :data:`CHARS_PER_TOKEN` characters
    a token, :data:`PER_MESSAGE` per message and :data:`PER_IMAGE` per image, plus the
    answer's ``max_tokens`` (the request's, else ``max_tokens``); at least 1.

    >>> from ai_lease.providers.base import ChatRequest
    >>> estimate_tokens(ChatRequest([{"role": "user", "content": "x" * 40}], max_tokens=100))
    114
    >>> estimate_tokens(None, 256)
    256
    """
    if request is None:
        return max(1, max_tokens or 0)
    chars = images = 0
    for message in request.messages:
        text, pictures = _sizes(message)
        chars, images = chars + text, images + pictures
    if request.tools:
        chars += len(orjson.dumps(list(request.tools)))
    cap = request.max_tokens or max_tokens or 0
    prompt = math.ceil(chars / CHARS_PER_TOKEN) + PER_MESSAGE * len(request.messages)
    return max(1, prompt + PER_IMAGE * images + cap)


def _sizes(message: Mapping[str, Any]) -> tuple[int, int]:
    """A message's characters of text (its tool calls' arguments too) and its images."""
    content, chars, images = message.get("content"), 0, 0
    if isinstance(content, str):
        chars = len(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if part.get("type") == "image_url":
                images += 1
            elif isinstance(text := part.get("text"), str):
                chars += len(text)
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            chars += len(str(function.get("arguments") or "")) + len(str(function.get("name")))
    return chars, images


@dataclass
class TokenUse:
    """The tokens a call's answer spent, said by the call (None: not said)."""

    tokens: int | None = None

    def spent(self, usage: Usage | None) -> None:
        """The answer's usage (None: the server sent none, and the estimate stays)."""
        if usage is not None and usage.prompt_tokens + usage.completion_tokens > 0:
            self.tokens = usage.prompt_tokens + usage.completion_tokens


class HeadersHeard:
    """Hears a call's answers' headers (:func:`~ai_lease.providers.rate_headers.listening`):
    when they say the provider's limit is spent, every name of the call's ``limits`` is paused
    in the store until the reset (a task each: hearing never blocks the answer), and
    ``said(limit, seconds)`` is called once the pause landed. :meth:`settled` awaits them."""

    def __init__(
        self,
        store: SlotStore,
        limits: tuple[CallLimit, ...],
        said: Callable[[str, float], None],
    ) -> None:
        self.store, self.limits, self.said = store, limits, said
        self.tasks: set[asyncio.Task[None]] = set()
        self.until = 0.0  # monotonic: a pause already asked for that lasts until then

    def __call__(self, headers: Mapping[str, str]) -> None:
        seconds = spent_for(headers)
        if seconds is None or seconds < PAUSE_RANGE[0]:
            return
        seconds = min(seconds, PAUSE_RANGE[1])
        if time.monotonic() + seconds <= self.until:
            return  # asked already (another answer of the same call said it too)
        self.until = time.monotonic() + seconds
        for limit in self.limits:
            task = asyncio.ensure_future(self._pause(limit, seconds))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pause(self, limit: CallLimit, seconds: float) -> None:
        paused = 0.0
        try:
            for name in limit.names:
                paused = max(paused, await self.store.pause_slot(name, seconds))
        except StoreError as err:
            log.warning("limit %s not paused for a spent rate limit (%s)", limit.name, err)
            return
        self.said(limit.name, paused)

    async def settled(self) -> None:
        """Every pause asked for has landed or failed."""
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
