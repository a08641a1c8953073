"""Retries of one model call (tenacity): transient failures only, never past the deadline.

Retried: a :class:`ProviderError` marked retryable (429 — honouring ``Retry-After`` —, 5xx,
connection reset, garbage where JSON was promised) and a :class:`FirstTokenTimeout`, as long
as no content had arrived. A stream that broke after content arrived is not silently resent
(the runner's next *attempt* may run the stage again, visibly) — except a
:class:`StreamInterrupted` one: the server itself ended that answer without a finish reason
(llama.cpp's server does so when another request arrives), its partial text is dropped, and
calling again is what the caller would do. A retry is never progress.
The wait is exponential with jitter; a retry whose wait would end past ``deadline_at``
(the stage's hard deadline, monotonic clock) is not made.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from ai_lease.errors import FirstTokenTimeout, ProviderError, StreamInterrupted
from ai_lease.timeouts import RetryPolicy

__all__ = ["CALL_RETRY", "call_with_retries", "is_transient"]

T = TypeVar("T")

CALL_RETRY = RetryPolicy(attempts=3, initial=0.5, multiplier=2.0, max_backoff=8.0)
"""Default retries of one model call: up to 3 tries, 0.5 s then 1 s apart (with jitter)."""


def is_transient(exc: BaseException) -> bool:
    """Worth calling again: retryable and nothing was received yet (or interrupted)."""
    if isinstance(exc, StreamInterrupted):
        return True
    if isinstance(exc, ProviderError):
        return exc.retryable and not exc.partial
    return isinstance(exc, FirstTokenTimeout)


class _PastDeadline(stop_base):
    def __init__(self, deadline_at: float | None, clock: Callable[[], float]) -> None:
        self.deadline_at, self.clock = deadline_at, clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        if self.deadline_at is None:
            return False
        return self.clock() + retry_state.upcoming_sleep >= self.deadline_at


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy = CALL_RETRY,
    *,
    deadline_at: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> T:
    """Await ``call()``, calling it again after transient failures (see module docstring)."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = policy.backoff(state.attempt_number) * random.uniform(0.5, 1.0)
        hint = exc.retry_after if isinstance(exc, ProviderError) else None
        return max(backoff, hint or 0.0)

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            on_retry(state.outcome.exception() or RuntimeError(), state.upcoming_sleep)

    # The first call goes straight through: tenacity's machinery costs ~50 µs per call,
    # and most calls succeed. It takes over, with the same policy, after a transient error.
    try:
        return await call()
    except Exception as exc:
        if not is_transient(exc) or policy.attempts < 2:
            raise
        first = exc

    first_done = False

    async def again() -> T:
        nonlocal first_done
        if not first_done:  # replay the first failure so waits and stops count it
            first_done = True
            raise first
        return await call()

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=wait,
        stop=stop_after_attempt(policy.attempts) | _PastDeadline(deadline_at, clock),
        reraise=True,
        sleep=asyncio.sleep,
        before_sleep=before_sleep,
    )
    async for attempt in retrying:
        with attempt:
            return await again()
    raise AssertionError("unreachable: tenacity reraises the last error")
