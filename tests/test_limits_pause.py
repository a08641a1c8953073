"""A 429 with a retry hint pauses the whole limit (issue 29, rates): the call that saw it
pauses the limit in the store for the hinted time, and no runner's call of that limit is sent
until the pause ends; they wait in line, saying so. One 429 reaches the fleet, instead of
every waiting call finding its own.

On every store, three runners (three nodes' worth) share a limit of two concurrent calls to a
loopback server that answers three requests, then refuses everything for 1.5 s with 429 and
``retry-after-ms``, then answers three more, and so on."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from ai_lease import RetryPolicy
from ai_lease.job import Job
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.lease.slots import SlotWait
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.timeouts import StreamTimeouts
from tests.harness.limits import limit_timings
from tests.harness.sse_server import Request, Response, SSEServer, chat_chunks, json_response, sse

REAL_TIME = "the server's quota reopens in real time and the store judges pauses by its own clock"

QUOTA, CLOSED_S, JOBS, RUNNERS, CONCURRENCY = 3, 1.5, 12, 3, 2
TIMINGS = limit_timings(ttl=5.0, call_ai_hard=60)


class Quota:
    """``QUOTA`` answers, then every request refused for ``CLOSED_S`` (429 with the
    milliseconds left in ``retry-after-ms``), then ``QUOTA`` answers again."""

    def __init__(self) -> None:
        self.used, self.closed_until, self.refused, self.answered = 0, 0.0, 0, 0

    def __call__(self, request: Request) -> Response:
        now = time.monotonic()
        if now >= self.closed_until and self.used < QUOTA:
            self.used += 1
            self.answered += 1
            return sse(*chat_chunks(["paid ", "for"]))
        if now >= self.closed_until:  # the quota just ran out
            self.closed_until, self.used = now + CLOSED_S, 0
        self.refused += 1
        left_ms = math.ceil((self.closed_until - now) * 1000)
        body = {"error": {"message": "quota spent", "type": "rate_limit_exceeded"}}
        return json_response(429, body, {"retry-after-ms": str(left_ms)})


async def test_one_429_pauses_the_limit_for_every_runner(slot_store: Any) -> None:
    """Twelve jobs over three runners all finish whole; the server refuses at most one call
    per slot each time its quota runs out (the calls already sent), not every waiting one;
    the 429 says how long it paused the limit, and the waiting calls say they wait for it."""
    events: list[Event] = []
    quota = Quota()
    async with SSEServer(responder=quota) as server:
        limit = CallLimit(server.base_url, CONCURRENCY, max_wait=60)
        config = RunConfig(
            timings=TIMINGS,
            retry=RetryPolicy(attempts=1),
            call_retry=RetryPolicy(attempts=8, initial=0.05, max_backoff=5),
            stream_timeouts=StreamTimeouts(first_token=5, idle=5, total=30),
            limits=CallLimits((limit,)),
        )
        providers = [
            OpenAICompatProvider(base_url=server.base_url, model="m") for _ in range(RUNNERS)
        ]
        hooks = RunHooks(events.append)
        runners = [Runner(slot_store, provider=p, config=config, hooks=hooks) for p in providers]
        try:
            jobs = [runners[i % RUNNERS].run(Job(f"j{i}", input="x")) for i in range(JOBS)]
            done = await asyncio.wait_for(asyncio.gather(*jobs), 120)
        finally:
            for p in providers:
                await p.aclose()
    assert [d.output for d in done] == ["paid for"] * JOBS
    assert quota.answered == JOBS
    closings = JOBS // QUOTA - 1  # the quota runs out after each block of three but the last
    assert 1 <= quota.refused <= CONCURRENCY * closings, quota.refused
    limited = [e for e in events if e.kind == "rate_limited"]
    assert len(limited) == quota.refused
    assert all(0 < float(e.attrs["paused"]) <= CLOSED_S for e in limited)
    paused_waits = [e for e in events if e.kind == "slot_wait" and "by the provider" in e.detail]
    assert paused_waits, "a call held back by the pause says so"
    assert paused_waits[0].detail.startswith(f"waiting for a slot of {limit.name} (paused ")


async def test_a_slot_holder_pauses_the_limit_for_everyone(slot_store: Any) -> None:
    """``client.slot``'s handle: ``pause()`` holds back every other caller of the limit,
    with slots free, until the pause ends; they are then served in their order."""
    first = SlotHold(slot_store, "api:m", "first", capacity=2, ttl=5, max_wait=10)
    async with first:
        assert 0.5 < await first.pause(0.6) <= 0.6
    later = SlotHold(slot_store, "api:m", "later", capacity=2, ttl=5, max_wait=10)
    outcome = await slot_store.acquire_slot("api:m", "peek", capacity=2, ttl=5)
    assert isinstance(outcome, SlotWait) and outcome.paused > 0
    await slot_store.leave_slot("api:m", "peek")
    started = time.monotonic()
    async with later:
        waited = time.monotonic() - started
    assert later.waited > 0.2 and waited < 5, waited
