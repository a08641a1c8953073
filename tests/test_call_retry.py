"""Retries of one model call: which failures are retried, the waits, and the deadline."""

from __future__ import annotations

import asyncio

import pytest

from ai_lease import FirstTokenTimeout, ProviderError, RetryPolicy, StreamIdleTimeout
from ai_lease.retry import call_with_retries, is_transient
from ai_lease.testing.clock import VirtualClock, on_virtual_time

FAST = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)


class Calls:
    def __init__(self, *errors: BaseException) -> None:
        self.errors, self.count = list(errors), 0

    async def __call__(self) -> str:
        self.count += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (ProviderError("503", retryable=True, status=503), True),
        (ProviderError("429", retryable=True, status=429, retry_after=0.01), True),
        (ProviderError("cut after content", retryable=True, partial=True), False),
        (ProviderError("401", retryable=False, status=401), False),
        (FirstTokenTimeout(1.0), True),
        (StreamIdleTimeout(1.0, 3, "abc"), False),
        (ValueError("bug"), False),
    ],
)
def test_what_counts_as_transient(error: BaseException, transient: bool) -> None:
    """Only failures before any content that may pass on their own are retried."""
    assert is_transient(error) is transient


async def test_transient_errors_are_retried_until_success() -> None:
    """A 500 then a reset, then success: three calls, one answer."""
    call = Calls(ProviderError("500", retryable=True), ProviderError("reset", retryable=True))
    assert await call_with_retries(call, FAST) == "ok" and call.count == 3


async def test_non_retryable_fails_at_once_with_its_message() -> None:
    """A 401 is raised after one call with the provider's message."""
    call = Calls(ProviderError("HTTP 401: Incorrect API key", retryable=False, status=401))
    with pytest.raises(ProviderError, match="Incorrect API key"):
        await call_with_retries(call, FAST)
    assert call.count == 1


def loop_clock() -> VirtualClock:
    """The running VirtualLoop's clock: the retries wait on the loop's timers only."""
    clock: VirtualClock = asyncio.get_running_loop().clock  # type: ignore[attr-defined]
    return clock


@on_virtual_time
async def test_retry_after_is_honoured() -> None:
    """A 429's Retry-After sets the wait when it is longer than the backoff."""
    call = Calls(ProviderError("429", retryable=True, status=429, retry_after=0.3))
    clock = loop_clock()
    started = clock()
    await call_with_retries(call, FAST, clock=clock)
    assert 0.3 <= clock() - started < 1.5


async def test_attempts_are_bounded() -> None:
    """After the last attempt the last error is raised as is."""
    call = Calls(*[ProviderError(f"503 #{i}", retryable=True) for i in range(5)])
    with pytest.raises(ProviderError, match="#2"):
        await call_with_retries(call, FAST)
    assert call.count == 3


@on_virtual_time
async def test_no_retry_whose_wait_would_pass_the_deadline() -> None:
    """A retry that could only start after the stage deadline is not made."""
    call = Calls(ProviderError("429", retryable=True, retry_after=5.0))
    clock = loop_clock()
    started = clock()
    with pytest.raises(ProviderError):
        await call_with_retries(call, FAST, deadline_at=clock() + 1.0, clock=clock)
    assert call.count == 1 and clock() - started < 0.5


async def test_on_retry_reports_each_wait() -> None:
    """on_retry sees every retried error and its wait (for logs and metrics)."""
    seen: list[tuple[str, float]] = []
    call = Calls(ProviderError("503", retryable=True))
    await call_with_retries(call, FAST, on_retry=lambda e, w: seen.append((str(e), w)))
    assert len(seen) == 1 and seen[0][0] == "503" and 0 < seen[0][1] <= 0.02
