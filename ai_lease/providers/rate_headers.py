"""What a provider's answers say of its rate limit, for whoever holds the call's ``[limits]``.

A success answer tells how much of the key's limit is left, and when it fills again:

* OpenAI and the servers that copy its headers (Azure OpenAI, Groq, OpenRouter, LiteLLM's
  proxy…): ``x-ratelimit-remaining-requests`` / ``-tokens`` and ``x-ratelimit-reset-requests``
  / ``-tokens`` (a duration, ``"1s"``, ``"6m0s"``, ``"20ms"``);
* Anthropic: ``anthropic-ratelimit-requests-remaining`` / ``-tokens-remaining`` (and
  ``-input-tokens-`` / ``-output-tokens-``) with ``…-reset`` as an RFC 3339 time.

When one says nothing is left (remaining 0), the next call would be refused with a 429 until
the reset: :func:`spent_for` is how long, so the fleet's limit can be paused that long
before anyone is refused (another program on the same key spends it too).

The HTTP paths call :func:`heard` with every answer's headers (the lean adapters in
:func:`~ai_lease.providers.http_paths.check_answer`, the SDK's in its response hook); it
costs one context-variable read when nobody listens. The runner listens around a call that
holds a limit (:func:`listening`): the call and the tasks it starts hear its answers, no
other call does.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime

from ai_lease.providers.errors import MAX_RETRY_AFTER_S, go_duration

__all__ = ["Listener", "heard", "listening", "spent_for"]

Listener = Callable[[Mapping[str, str]], None]
"""Called with an answer's headers (sync: it must not block; start a task for store work)."""

_LISTENER: ContextVar[Listener | None] = ContextVar("ai_lease_rate_headers", default=None)

_OPENAI = ("requests", "tokens")
_ANTHROPIC = ("requests", "tokens", "input-tokens", "output-tokens")


def heard(headers: Mapping[str, str]) -> None:
    """An answer arrived with ``headers``: the listener of this call, if any, hears them."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(headers)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Within the block (and the tasks started in it), answers' headers go to ``listener``."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def spent_for(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds until the provider's exhausted limits fill again: the longest reset of the
    ones whose remaining count is 0 (at most :data:`MAX_RETRY_AFTER_S`); None when none is
    spent, or a spent one gives no reset it can be read for. ``now``: epoch seconds
    (Anthropic's resets are times).

    >>> spent_for({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"})
    1.5
    >>> spent_for({"x-ratelimit-remaining-tokens": "12", "x-ratelimit-reset-tokens": "6s"})
    >>> reset = "2026-01-01T00:00:02Z"
    >>> spent_for({"anthropic-ratelimit-tokens-remaining": "0",
    ...            "anthropic-ratelimit-tokens-reset": reset}, now=1767225600.0)
    2.0
    """
    waits: list[float | None] = []
    for kind in _OPENAI:
        if _spent(headers.get(f"x-ratelimit-remaining-{kind}")):
            waits.append(go_duration(headers.get(f"x-ratelimit-reset-{kind}")))
    for kind in _ANTHROPIC:
        if _spent(headers.get(f"anthropic-ratelimit-{kind}-remaining")):
            at = _rfc3339(headers.get(f"anthropic-ratelimit-{kind}-reset"))
            waits.append(None if at is None else at - (time.time() if now is None else now))
    known = [w for w in waits if w is not None and math.isfinite(w)]
    if not known:
        return None
    return min(max(0.0, max(known)), MAX_RETRY_AFTER_S)


def _spent(value: str | None) -> bool:
    return value is not None and value.strip() == "0"


def _rfc3339(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 time (``2026-01-01T00:00:02Z``); None for anything else."""
    if not value or len(value) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return stamp.timestamp() if stamp.tzinfo is not None else None
