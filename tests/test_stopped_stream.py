"""A process stopped (SIGSTOP) mid-stream and resumed: the lease is lost, and that is the
only reason given: the stream guard's idle timeout, due at the same moment, is not also
reported (issue 25, item 15)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

from ai_lease.job import Job, Status
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.timeouts import LeaseTimings, RetryPolicy, StreamTimeouts

REAL_TIME = "the owner is a real process, SIGSTOPped and resumed"


TIMINGS = LeaseTimings(
    ttl=1.0, renew_interval=0.2, op_timeout=0.1, poll_interval=0.05, self_fence_margin=0.3
)


class StoppedOnce:
    """Streams "Hel", then the whole process stops for 1.5 s (the loop blocked, as by
    SIGSTOP) and the stream says nothing more; a later call answers whole."""

    name = "stopped-once"

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        self.calls += 1
        if self.calls > 1:
            yield Delta("Hello", finish_reason="stop")
            return
        yield Delta("Hel")
        asyncio.get_running_loop().call_later(0.05, time.sleep, 1.5)
        await asyncio.sleep(30)

    async def complete(self, request: ChatRequest) -> Completion:
        raise NotImplementedError

    async def aclose(self) -> None:
        pass


async def test_a_stopped_owner_reports_the_lost_lease_not_a_stream_timeout(
    tmp_path: Path,
) -> None:
    """Stopped past both the self-fence point and the idle budget: the attempt ends for the
    lost lease (self_fenced), no stream_timeout event is said, and the job is then done."""
    events: list[Event] = []
    config = RunConfig(
        timings=TIMINGS,
        retry=RetryPolicy(attempts=3, initial=0.05, max_backoff=0.05),
        call_retry=RetryPolicy(attempts=1),
        stream_timeouts=StreamTimeouts(first_token=5, idle=0.3, total=30),
        node_id="n1",
    )
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        provider = StoppedOnce()
        runner = Runner(store, provider=provider, config=config, hooks=RunHooks(events.append))
        record = await runner.run(Job("stopped", input="x."))
    finally:
        await store.aclose()
    kinds = [event.kind for event in events]
    assert "self_fenced" in kinds, kinds
    assert "stream_timeout" not in kinds, [e for e in events if e.kind == "stream_timeout"]
    assert record.status is Status.DONE and record.output == "Hello" and provider.calls == 2
