"""The live pages' shared reads: one read per interval per view however many pages watch it,
and never, for a page's stream, a read begun before that stream opened (the page itself was
rendered from a newer one: the stream would take the page back in time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ai_lease.ui.shared_reads import Read, SharedReads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def counting_read(clock: Clock, answers: list[str], seconds: float = 0.0) -> Read:
    """A read answering ``answers`` in turn; its store takes ``seconds`` (on ``clock``)."""

    async def read() -> tuple[object, Callable[[], str]]:
        answer = answers.pop(0)
        await asyncio.sleep(0)
        clock.now += seconds
        return answer, lambda: f"<p>{answer}</p>"

    return read


async def test_callers_within_max_age_share_one_read() -> None:
    clock = Clock()
    reads = SharedReads(clock=clock)
    read = counting_read(clock, ["one", "two"])
    assert await reads.get("view", read, max_age=1.0) == ("one", "<p>one</p>")
    clock.now += 0.5
    assert await reads.get("view", read, max_age=1.0) == ("one", "<p>one</p>")
    clock.now += 0.6
    assert await reads.get("view", read, max_age=1.0) == ("two", "<p>two</p>")


async def test_a_stream_takes_no_read_begun_before_it_opened() -> None:
    """A read kept at 100.0 is fresh for max_age 5, but not for a stream opened at 100.5; a
    read begun at 101 and ended at 103 (the store slow) is older than a stream opened at 102."""
    clock = Clock()
    reads = SharedReads(clock=clock)
    read = counting_read(clock, ["old", "new"])
    assert (await reads.get("view", read, max_age=5.0))[0] == "old"
    clock.now = 100.5
    assert (await reads.get("view", read, max_age=5.0, newer_than=100.0))[0] == "old"
    assert (await reads.get("view", read, max_age=5.0, newer_than=100.5))[0] == "new"

    clock.now = 101.0
    slow = counting_read(clock, ["slow", "after"], seconds=2.0)
    assert (await reads.get("other", slow, max_age=5.0))[0] == "slow"
    assert clock.now == 103.0
    assert (await reads.get("other", slow, max_age=5.0, newer_than=102.0))[0] == "after"
