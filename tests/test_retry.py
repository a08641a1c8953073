"""The retry module: the named policies' waits and counts, the commit resend, the job's rounds."""

from __future__ import annotations

import sqlite3
import time

import pytest

from ai_lease import ConfigError, RetryPolicy, StoreUnavailable
from ai_lease.retry import (
    COMMIT_RESEND,
    JOB_ATTEMPTS,
    MODEL_CALL,
    STALE_CONNECTION,
    resend,
    run_rounds,
    while_locked,
)


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


async def test_a_stale_connection_gets_exactly_one_resend() -> None:
    """STALE_CONNECTION: one resend at once; a second stale connection raises."""
    landed, stale_twice = Sends(failures=1), Sends(failures=2)
    assert await resend(landed, STALE_CONNECTION, StoreUnavailable) == "stored"
    with pytest.raises(StoreUnavailable):
        await resend(stale_twice, STALE_CONNECTION, StoreUnavailable)
    assert (landed.count, stale_twice.count) == (2, 2)


async def test_no_resend_once_until_says_the_deadline_passed() -> None:
    """``until()`` true after the first failure: that failure is raised, nothing resent."""
    send = Sends(failures=1)
    with pytest.raises(StoreUnavailable):
        await resend(send, COMMIT_RESEND, StoreUnavailable, until=lambda: True)
    assert send.count == 1


def test_while_locked_retries_a_locked_file_until_it_opens() -> None:
    """Two "database is locked" answers, then the call lands; other errors pass at once."""
    tries = 0

    def open_file() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise sqlite3.OperationalError("database is locked")
        return "open"

    assert while_locked(open_file, seconds=5.0, every=0.001) == "open"
    assert tries == 3

    def broken() -> str:
        nonlocal tries
        tries += 1
        raise sqlite3.OperationalError("disk I/O error")

    tries = 0
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        while_locked(broken, seconds=5.0)
    assert tries == 1


def test_while_locked_gives_up_after_its_seconds() -> None:
    """A file locked for good: the last "locked" error is raised once the time is up."""
    started = time.monotonic()

    def locked() -> None:
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        while_locked(locked, seconds=0.05, every=0.01)
    # real: while_locked waits with time.sleep, off any loop
    assert time.monotonic() - started < 5.0  # generous: it stops, it does not spin forever
