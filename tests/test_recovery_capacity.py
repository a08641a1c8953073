"""The takeover bound holds when every slot of the surviving worker is busy: a lapsed job is
taken over within ``ttl + sweep`` of its owner's last renewal (a recovery may run beyond
``concurrency`` by the worker's reserve), and an owner that fenced itself frees its slot at
once instead of keeping it while it retries. On each store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ai_lease import LeaseTimings, StageBudget, StoreUnavailable
from ai_lease.job import Job
from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired
from ai_lease.lease.events import Event
from ai_lease.lease.queue import JobQueue
from ai_lease.providers.base import ChatRequest, Delta
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.stores import open_store
from ai_lease.testing.scripted import Pause, ScriptedProvider
from ai_lease.timeouts import RetryPolicy

TTL, SWEEP = 2.0, 0.2
SLACK = 1.5  # a loaded CI machine; the unfixed worker needed the busy job's full 10 s
LONG = 10.0  # seconds a busy job streams (a chunk every 0.1 s: progress all along)


def timings() -> LeaseTimings:
    budgets = dict(LeaseTimings().stage_budgets)
    budgets["call_ai"] = StageBudget(0.6, 60.0)
    return LeaseTimings(
        ttl=TTL,
        renew_interval=0.5,
        op_timeout=0.3,
        poll_interval=0.1,
        self_fence_margin=0.5,
        stage_budgets=budgets,
    )


class ByKey:
    """Streams for ``LONG`` seconds (a chunk every 0.1 s)."""

    name = "by-key"

    def __init__(self) -> None:
        self.busy = ScriptedProvider(["a", Pause(0.1)] * int(LONG * 10))

    def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        return self.busy.stream(request)

    async def aclose(self) -> None:
        pass


@pytest.fixture
async def queue(store_url: str) -> AsyncIterator[LeaseStore]:
    store = open_store(store_url, op_timeout=1.0)
    assert isinstance(store, JobQueue)
    yield store
    await store.aclose()


class Seen:
    """When (monotonic clock) each event kind was first seen per key."""

    def __init__(self) -> None:
        self.at: dict[tuple[str, str], float] = {}
        self.events: list[Event] = []
        self.changed = asyncio.Event()

    def __call__(self, event: Event) -> None:
        self.events.append(event)
        self.at.setdefault((event.kind, event.key), time.monotonic())
        self.changed.set()

    async def wait(self, kind: str, key: str, timeout: float) -> float:
        async with asyncio.timeout(timeout):
            while (kind, key) not in self.at:
                self.changed.clear()
                await self.changed.wait()
        return self.at[kind, key]

    def story(self) -> str:
        return "\n".join(f"{e.kind} {e.key} {e.owner_id}: {e.detail}" for e in self.events)


def worker(store: LeaseStore, seen: Seen, **options: Any) -> Worker:
    runner = Runner(
        store,
        provider=ByKey(),
        config=RunConfig(
            timings=timings(),
            retry=RetryPolicy(attempts=3, initial=1.0),
            record_history=False,
            trace=False,
            node_id="survivor",
        ),
        hooks=RunHooks(on_event=seen),
    )
    return Worker(store, runner, sweep_interval=SWEEP, grace=0.0, **options)


def job(key: str) -> Job:
    return Job(key, input=key, prompt_text="{{ input }}")


async def test_a_lapsed_job_is_taken_over_in_time_with_every_slot_busy(queue: LeaseStore) -> None:
    """A dead owner's job lapses while both slots of the only worker run 10 s jobs and four
    more wait: it is taken over within ttl + sweep of its last renewal (plus slack)."""
    runner_for_submit = Runner(queue, provider=ByKey())
    await runner_for_submit.submit(job("lost"))
    sent = time.monotonic()
    dead = await queue.acquire("lost", "dead#1.0000", ttl=TTL, max_no_progress=30.0)
    assert isinstance(dead, Acquired)
    # What the dead worker did as it started the job: a recovery look for when its lease
    # could lapse, should it die.
    await queue.recover_at("lost", dead.job.read_at + TTL)  # type: ignore[attr-defined]
    for i in range(6):
        await runner_for_submit.submit(job(f"busy{i}"))
    seen = Seen()
    w = worker(queue, seen, concurrency=2)
    async with asyncio.timeout(30):
        async with w:
            took_at = await seen.wait("acquired", "lost", timeout=LONG)
            w.kill()
    took = took_at - sent
    busy = sum(1 for kind, key in seen.at if kind == "acquired" and key.startswith("busy"))
    assert busy >= 2, seen.story()  # both slots were busy the whole time
    # real: a worker on a real store; the lease lapses on its clock
    assert took <= TTL + SWEEP + SLACK, f"taken over {took:.2f}s after the last renewal"


class UnreachableFor:
    """``store``, except that once a renewal of ``key`` is sent, every call naming ``key``
    fails (the store unreachable for that job) for ``seconds``: its owner self-fences, and
    its next acquire and looks fail too."""

    def __init__(self, store: LeaseStore, key: str, seconds: float) -> None:
        self._store, self.key, self.seconds = store, key, seconds
        self.since: float | None = None

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._store, name)
        if not asyncio.iscoroutinefunction(call):
            return call

        async def maybe_failing(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else None
            named = getattr(first, "key", first) == self.key
            if named and name == "renew" and self.since is None:
                self.since = time.monotonic()
            if named and self.since is not None and time.monotonic() - self.since < self.seconds:
                raise StoreUnavailable("test", name, f"{self.key} unreachable (injected)")
            return await call(*args, **kwargs)

        return maybe_failing


async def test_a_self_fenced_owner_frees_its_slot_at_once(queue: LeaseStore) -> None:
    """A worker with one slot and no reserve: its job's store calls fail for 6 s, so the
    owner self-fences; the slot is free for the next job at once, not after the outage."""
    runner_for_submit = Runner(queue, provider=ByKey())
    await runner_for_submit.submit(job("cut-off"))
    seen = Seen()
    flaky = UnreachableFor(queue, "cut-off", 6.0)
    w = worker(flaky, seen, concurrency=1, recovery_reserve=0)  # type: ignore[arg-type]
    async with asyncio.timeout(30):
        async with w:
            await seen.wait("acquired", "cut-off", timeout=5)
            await runner_for_submit.submit(job("next"))
            fenced_at = await seen.wait("self_fenced", "cut-off", timeout=5)
            started_at = await seen.wait("acquired", "next", timeout=LONG)
            w.kill()
    gap = started_at - fenced_at
    assert gap <= SWEEP + SLACK, f"the next job started {gap:.2f}s after the self-fence"


def test_a_negative_reserve_is_refused() -> None:
    """``recovery_reserve`` must be an integer >= 0, and the error names the field."""
    store = open_store("sqlite:///:memory:")
    runner = Runner(store, provider=ByKey())
    with pytest.raises(ValueError, match="recovery_reserve"):
        Worker(store, runner, recovery_reserve=-1)
