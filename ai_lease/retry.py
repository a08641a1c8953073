"""Retries, on tenacity: one value object, :class:`RetryPolicy`, and the policies that use it.

Two retry loops run in ai_lease, at two scales:

* :data:`JOB_ATTEMPTS` — attempts of a **whole job**, across nodes: after a failed attempt
  (timeout, provider error, crash) the owner releases the job with its error and waits
  1 s, 2 s, 4 s … before competing again; the *store* counts the attempts, so a job ends
  FAILED after the last one whichever node made it. The runner's loop of rounds
  (:func:`run_rounds`) is a tenacity loop that waits what each round asks for.
* :data:`MODEL_CALL` — retries of **one model call** within the ``call_ai`` stage
  (:func:`call_with_retries`): transient failures only, 0.5 s then 1 s apart with jitter,
  or longer when the provider asks (its hint: ``Retry-After``, ``retry-after-ms``, Gemini's
  ``retryDelay``, OpenAI's ``x-ratelimit-reset-*``:
  :func:`~ai_lease.providers.errors.retry_hint`), and never past the stage's hard deadline.
  A retried call of a background response resumes it (:mod:`ai_lease.run.background`).
  The first call goes straight through; tenacity takes over after a transient error. An
  **interrupted** stream (:class:`StreamInterrupted`: another request took the server's
  slot) is called again up to
  :data:`INTERRUPTED_CALLS` times in all, the waits growing (0.5, 1, 2, 4, then 8 s, each
  times a random 0.5-1.0) so that callers contending for one slot spread out.

Below them, the stores resend one operation (:func:`resend`), never more than their
``op_timeout`` allows: :data:`COMMIT_RESEND` resends a fenced commit whose answer was lost
(the commit is idempotent on its fence, so a resend returns the same record);
:data:`STALE_CONNECTION` sends a Redis call once more on another connection after its pooled
one went stale (every script is safe to run twice); and :func:`while_locked` retries the
SQLite file's switch to WAL, which SQLite's busy handler does not cover.

Retried by :func:`call_with_retries`: a :class:`ProviderError` marked retryable (429 —
honouring the provider's retry hint —, 5xx, connection reset, garbage where JSON was promised) and a
:class:`FirstTokenTimeout`, as long as no content had arrived. A stream that broke after
content arrived is not silently resent (the runner's next *attempt* may run the stage again,
visibly) — except a :class:`StreamInterrupted` one: the server itself ended that answer
without a finish reason (llama.cpp's server does so when another request arrives), its
partial text is dropped, and calling again is what the caller would do. A retry is never
progress. A 5xx whose body says the request itself is invalid (a ``json_schema`` llama.cpp
cannot compile: :class:`~ai_lease.errors.RequestRefused`) is called once more,
no more, and fails the job without another attempt.

>>> JOB_ATTEMPTS.backoff(1), JOB_ATTEMPTS.backoff(2), JOB_ATTEMPTS.backoff(3)
(1.0, 2.0, 4.0)
"""

from __future__ import annotations

import asyncio
import math
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_fixed,
)
from tenacity.retry import retry_base
from tenacity.stop import stop_base

from ai_lease.errors import (
    ConfigError,
    FirstTokenTimeout,
    ProviderError,
    RequestRefused,
    StreamInterrupted,
)

__all__ = [
    "COMMIT_RESEND",
    "INTERRUPTED_CALLS",
    "JOB_ATTEMPTS",
    "MODEL_CALL",
    "STALE_CONNECTION",
    "RetryPolicy",
    "call_with_retries",
    "is_transient",
    "resend",
    "run_rounds",
    "while_locked",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often to try and how long to wait in between: ``attempts`` tries in all, waits
    growing from ``initial`` by ``multiplier``, capped at ``max_backoff`` (float seconds).

    >>> RetryPolicy(attempts=5, initial=0.5).backoff(3)
    2.0
    """

    attempts: int = 3
    initial: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not (
            isinstance(self.attempts, int) and self.attempts >= 1
        ):
            raise ConfigError(
                f"RetryPolicy.attempts: must be an integer >= 1 (got {self.attempts!r})"
            )
        for name in ("initial", "max_backoff"):
            _seconds(self, name)
        if self.multiplier < 1:
            raise ConfigError(f"RetryPolicy.multiplier: must be >= 1 (got {self.multiplier!r})")

    def wait(self) -> wait_exponential:
        """The tenacity wait strategy of this policy (before try ``n + 1``, after try ``n``)."""
        return wait_exponential(
            multiplier=self.initial, exp_base=self.multiplier, max=self.max_backoff
        )

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt + 1`` (``attempt`` counts from 1)."""
        return float(self.wait()(_after_try(attempt)))


def _after_try(attempt: int) -> RetryCallState:
    """A retry state as tenacity's wait strategies see it after try number ``attempt``."""
    state = RetryCallState(cast(Any, None), None, (), {})  # waits read attempt_number only
    state.attempt_number = attempt
    return state


def _seconds(owner: RetryPolicy, name: str) -> None:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"RetryPolicy.{name}: must be a number of seconds")
    if math.isnan(value) or value <= 0 or math.isinf(value):
        raise ConfigError(
            f"RetryPolicy.{name}: must be a positive number of seconds (got {value!r})"
        )
    object.__setattr__(owner, name, float(value))


JOB_ATTEMPTS = RetryPolicy(attempts=3, initial=1.0, multiplier=2.0, max_backoff=30.0)
"""Attempts of a whole job across nodes: at most 3, 1 s then 2 s apart (4 s after a third)."""

MODEL_CALL = RetryPolicy(attempts=3, initial=0.5, multiplier=2.0, max_backoff=8.0)
"""Retries of one model call within a stage: up to 3 tries, 0.5 s then 1 s apart (jitter)."""

INTERRUPTED_CALLS = 8
"""Calls in all for a stream the server keeps interrupting (within the stage's deadline):
more than :data:`MODEL_CALL`'s 3, since an interruption is contention, not a fault."""

COMMIT_RESEND = RetryPolicy(attempts=3, initial=0.1, multiplier=2.0, max_backoff=30.0)
"""Resends of a fenced commit whose answer was lost: 3 sends, 0.1 s then 0.2 s apart."""


STALE_CONNECTION = RetryPolicy(attempts=2, initial=0.001, multiplier=1.0, max_backoff=0.001)
"""One resend of a store call whose pooled connection went stale, at once (1 ms)."""


# -- the job's rounds -------------------------------------------------------------------------


async def run_rounds(
    round_: Callable[[], Awaitable[object]], pause: Callable[[float], Awaitable[None]]
) -> object:
    """The runner's loop: call ``round_`` again as long as it returns a float (how long to
    stand aside first, spent in ``pause``); return its first other result. How long to wait
    after a failed attempt is the job retry policy's backoff (:data:`JOB_ATTEMPTS`); the
    store counts the attempts, and the job deadline bounds the loop.

    The first round goes straight through (most jobs need one): tenacity takes over, with
    the same rule, once a round asks for a pause.
    """
    first = await round_()
    if not isinstance(first, float):
        return first
    await pause(first)
    retrying = AsyncRetrying(
        retry=retry_if_result(_is_pause),
        wait=_pause_length,
        stop=stop_never,
        sleep=pause,
        reraise=True,
    )
    return await retrying(round_)


def _is_pause(outcome: object) -> bool:
    return isinstance(outcome, float)


def _pause_length(state: RetryCallState) -> float:
    assert state.outcome is not None
    return float(state.outcome.result())


# -- a resend after a lost reply --------------------------------------------------------------


async def resend(
    send: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    on: type[BaseException] | tuple[type[BaseException], ...],
    *,
    until: Callable[[], bool] | None = None,
) -> T:
    """Await ``send()``; after an ``on`` error send again, up to ``policy.attempts`` sends in
    all, waiting the policy's backoff (no jitter) in between; the last error is raised. With
    ``until``, no resend is made once ``until()`` is true (a deadline has passed).

    The first send goes straight through (it nearly always lands): tenacity takes over,
    counting that first failure, only after an ``on`` error.
    """
    try:
        return await send()
    except on as exc:
        if policy.attempts < 2 or (until is not None and until()):
            raise
        first = exc
    retry: retry_base = retry_if_exception_type(on)
    if until is not None:
        retry = retry & retry_if_exception(lambda _: not until())
    retrying = AsyncRetrying(
        retry=retry,
        wait=policy.wait(),
        stop=stop_after_attempt(policy.attempts),
        sleep=asyncio.sleep,
        reraise=True,
    )
    result: T = await retrying(_replaying(first, send))
    return result


def while_locked(call: Callable[[], T], seconds: float, every: float = 0.01) -> T:
    """Call ``call()`` (blocking, in the store's thread) again every ``every`` seconds while
    it raises a "database is locked" :class:`sqlite3.OperationalError`, for up to
    ``seconds``; then (or on any other error) the last error is raised."""
    retrying = Retrying(
        retry=retry_if_exception(_locked),
        wait=wait_fixed(every),
        stop=stop_after_delay(seconds),
        sleep=time.sleep,
        reraise=True,
    )
    return retrying(call)


def _locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


# -- one model call ---------------------------------------------------------------------------


def is_transient(exc: BaseException) -> bool:
    """Worth calling again: retryable and nothing was received yet (or interrupted). A
    :class:`~ai_lease.errors.RequestRefused` (a 5xx saying the request is invalid)
    is too, but :func:`call_with_retries` calls again after it once only."""
    if isinstance(exc, StreamInterrupted):
        return True
    if isinstance(exc, RequestRefused):
        return not exc.partial
    if isinstance(exc, ProviderError):
        return exc.retryable and not exc.partial
    return isinstance(exc, FirstTokenTimeout)


class _Transient(retry_base):
    """Tenacity's retry condition for one model call: :func:`is_transient`, and a
    :class:`~ai_lease.errors.RequestRefused` after the first try only."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        if exc is None or not is_transient(exc):
            return False
        return not isinstance(exc, RequestRefused) or retry_state.attempt_number < 2


class _Exhausted(stop_base):
    """``policy.attempts`` calls in all; :data:`INTERRUPTED_CALLS` after an interruption."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.attempts = policy.attempts
        self.interrupted = max(policy.attempts, INTERRUPTED_CALLS)

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        limit = self.interrupted if isinstance(exc, StreamInterrupted) else self.attempts
        return retry_state.attempt_number >= limit


class _PastDeadline(stop_base):
    def __init__(self, deadline_at: float | None, clock: Callable[[], float]) -> None:
        self.deadline_at, self.clock = deadline_at, clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        if self.deadline_at is None:
            return False
        return self.clock() + retry_state.upcoming_sleep >= self.deadline_at


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy = MODEL_CALL,
    *,
    deadline_at: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[BaseException, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``call()``, calling it again after transient failures (see module docstring).
    A retry whose wait would end past ``deadline_at`` (on ``clock``) is not made;
    ``on_retry(error, wait_s)`` is told of each retry before its wait (in ``sleep``)."""
    # The first call goes straight through: tenacity's machinery costs ~50 µs per call,
    # and most calls succeed. It takes over, with the same policy, after a transient error.
    try:
        return await call()
    except Exception as exc:
        if not is_transient(exc) or policy.attempts < 2:
            raise
        first = exc
    retrying = AsyncRetrying(
        retry=_Transient(),
        wait=_model_wait(policy),
        stop=_Exhausted(policy) | _PastDeadline(deadline_at, clock),
        reraise=True,
        sleep=sleep,
        before_sleep=_reporting(on_retry),
    )
    return await retrying(_replaying(first, call))


def _model_wait(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    """The policy's backoff with jitter, or the provider's retry hint if longer."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff = policy.backoff(state.attempt_number) * random.uniform(0.5, 1.0)
        hint = exc.retry_after if isinstance(exc, ProviderError) else None
        return max(backoff, hint or 0.0)

    return wait


def _reporting(
    on_retry: Callable[[BaseException, float], None] | None,
) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            on_retry(state.outcome.exception() or RuntimeError(), state.upcoming_sleep)

    return before_sleep


def _replaying(first: BaseException, call: Callable[[], Awaitable[T]]) -> Callable[[], Any]:
    """``call``, whose first run raises ``first`` again (so waits and stops count it)."""
    replayed = False

    async def again() -> T:
        nonlocal replayed
        if not replayed:
            replayed = True
            raise first
        return await call()

    return again
