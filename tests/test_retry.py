"""The retry module: the named policies' waits and counts, the commit resend, the job's rounds."""

from __future__ import annotations

import pytest

from ai_lease import ConfigError, RetryPolicy, StoreUnavailable
from ai_lease.retry import COMMIT_RESEND, JOB_ATTEMPTS, MODEL_CALL, resend, run_rounds


def test_job_attempts_wait_one_two_four_seconds_at_most_three_attempts() -> None:
    """JOB_ATTEMPTS is today's runner default: 3 attempts, 1 s, 2 s, 4 s apart, capped at 30 s."""
    assert JOB_ATTEMPTS == RetryPolicy()
    assert JOB_ATTEMPTS.attempts == 3
    assert [JOB_ATTEMPTS.backoff(n) for n in (1, 2, 3, 6, 20)] == [1.0, 2.0, 4.0, 30.0, 30.0]


def test_model_call_waits_half_a_second_then_one() -> None:
    """MODEL_CALL: up to 3 tries of one call, 0.5 s then 1 s (before jitter), capped at 8 s."""
    assert MODEL_CALL.attempts == 3
    assert [MODEL_CALL.backoff(n) for n in (1, 2, 3, 10)] == [0.5, 1.0, 2.0, 8.0]


def test_backoff_is_the_exponential_formula() -> None:
    """backoff(n) = min(max_backoff, initial * multiplier ** (n - 1)), for any policy."""
    policy = RetryPolicy(attempts=5, initial=0.05, multiplier=3.0, max_backoff=1.0)
    expected = [min(1.0, 0.05 * 3.0 ** (n - 1)) for n in range(1, 8)]
    assert [policy.backoff(n) for n in range(1, 8)] == expected


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"initial": 0}, "initial"),
        ({"max_backoff": float("inf")}, "max_backoff"),
        ({"multiplier": 0.5}, "multiplier"),
    ],
)
def test_a_bad_policy_names_its_field(kwargs: dict[str, object], field: str) -> None:
    """A bad value raises ConfigError naming RetryPolicy.<field>."""
    with pytest.raises(ConfigError, match=f"RetryPolicy.{field}"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


class Sends:
    def __init__(self, failures: int) -> None:
        self.failures, self.count = failures, 0

    async def __call__(self) -> str:
        self.count += 1
        if self.count <= self.failures:
            raise StoreUnavailable("sqlite:///x", "commit", "no answer")
        return "stored"


async def test_resend_sends_again_after_a_lost_reply() -> None:
    """Two lost replies: the third send lands, and its answer is returned."""
    send = Sends(failures=2)
    assert await resend(send, COMMIT_RESEND, StoreUnavailable) == "stored"
    assert send.count == 3


async def test_resend_gives_up_after_three_sends_with_the_last_error() -> None:
    """COMMIT_RESEND makes 3 sends in all, then raises the last StoreUnavailable."""
    send = Sends(failures=5)
    with pytest.raises(StoreUnavailable):
        await resend(send, COMMIT_RESEND, StoreUnavailable)
    assert send.count == 3


async def test_resend_does_not_retry_other_errors() -> None:
    """An error other than the one named goes straight through, after one send."""
    count = 0

    async def send() -> str:
        nonlocal count
        count += 1
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await resend(send, COMMIT_RESEND, StoreUnavailable)
    assert count == 1


async def test_rounds_pause_as_asked_until_a_round_ends_the_job() -> None:
    """run_rounds calls the round again after each pause it asks for, and returns the first
    result that is not a pause (None too)."""
    answers: list[object] = [0.0, 1.5, 0.25, None]
    paused: list[float] = []

    async def round_() -> object:
        return answers.pop(0)

    async def pause(seconds: float) -> None:
        paused.append(seconds)

    assert await run_rounds(round_, pause) is None
    assert paused == [0.0, 1.5, 0.25] and answers == []


async def test_rounds_raise_the_rounds_error() -> None:
    """An error a round raises ends the loop with that very error."""

    async def round_() -> object:
        raise LookupError("gone")

    async def pause(seconds: float) -> None:
        raise AssertionError("no pause after an error")

    with pytest.raises(LookupError, match="gone"):
        await run_rounds(round_, pause)
