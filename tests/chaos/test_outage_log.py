"""A store outage is said once: waiting jobs retry their acquire every poll interval, but the
log gets one ``store_unavailable`` line when the outage starts, a count while it lasts, and
one ``store_reachable`` line when it ends — not a line per job per poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ai_lease import LeaseTimings
from ai_lease.job import Job, Status
from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.outage import StoreOutage
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.stores import open_store
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.redis_server import RedisServer
from tests.harness.refusing_proxy import RefusingProxy

pytestmark = pytest.mark.chaos

OUTAGE = 2.0
TIMINGS = LeaseTimings(
    ttl=10.0, renew_interval=2.0, op_timeout=0.3, poll_interval=0.1, self_fence_margin=1.0
)


@pytest.fixture
async def proxy(redis_server: RedisServer) -> AsyncIterator[RefusingProxy]:
    redis_server.flushall()
    async with RefusingProxy("127.0.0.1", redis_server.port) as running:
        yield running


def kinds(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


async def test_followers_through_an_outage_say_it_once(
    proxy: RefusingProxy, redis_server: RedisServer
) -> None:
    """Four jobs follow another owner; the store refuses for 2 s (their acquires fail every
    0.1 s): one ``store_unavailable`` line, one ``store_reachable`` line, then the owner's
    results arrive."""
    direct = open_store(redis_server.url, op_timeout=1.0)
    proxied = open_store(proxy.url_for(), op_timeout=TIMINGS.op_timeout)
    events: list[Event] = []
    runner = Runner(
        proxied,
        provider=ScriptedProvider(["never called"]),
        config=RunConfig(timings=TIMINGS, record_history=False, trace=False),
        hooks=RunHooks(on_event=events.append),
    )
    keys = [f"k{i}" for i in range(4)]
    owned = [await direct.acquire(k, "elsewhere", ttl=30.0, max_no_progress=30.0) for k in keys]
    try:
        async with asyncio.timeout(20), asyncio.TaskGroup() as tg:
            runs = [tg.create_task(runner.run(Job(k, input="x"))) for k in keys]
            await asyncio.sleep(0.3)  # all four are following
            await proxy.refuse_for(OUTAGE)
            await asyncio.sleep(0.5)  # they reach the store again
            for lease in owned:
                assert isinstance(lease, Acquired)
                await direct.commit(lease.fence, '"theirs"')
    finally:
        await proxied.aclose()
        await direct.aclose()
    assert all(r.result().status is Status.DONE for r in runs)
    lines = [f"{e.kind} {e.key}: {e.detail}" for e in events if e.kind.startswith("store_")]
    assert len(kinds(events, "store_unavailable")) == 1, lines
    assert len(kinds(events, "store_reachable")) == 1, lines
    assert (kinds(events, "store_reachable")[0].value or 0) >= 4 * 5, lines  # all counted


async def test_a_worker_says_an_outage_once(proxy: RefusingProxy) -> None:
    """A worker sweeping every 0.05 s through a 2 s outage: one ``store_unavailable`` line
    and one ``store_reachable`` line, not one per sweep."""
    store: LeaseStore = open_store(proxy.url_for(), op_timeout=TIMINGS.op_timeout)
    events: list[Event] = []
    runner = Runner(
        store,
        provider=ScriptedProvider(["x"]),
        config=RunConfig(timings=TIMINGS, record_history=False, trace=False),
    )
    worker = Worker(store, runner, sweep_interval=0.05, grace=1.0, on_event=events.append)
    try:
        async with asyncio.timeout(20), worker:
            await asyncio.sleep(0.2)
            await proxy.refuse_for(OUTAGE)
            await asyncio.sleep(0.5)
    finally:
        await store.aclose()
    lines = [f"{e.kind} {e.key}: {e.detail}" for e in events if e.kind.startswith("store_")]
    assert len(kinds(events, "store_unavailable")) == 1, lines
    assert len(kinds(events, "store_reachable")) == 1, lines


def test_a_lasting_outage_is_counted_every_interval() -> None:
    """An outage that lasts is said again, with its count, once per ``every`` seconds; the
    end line carries the total; the next outage starts a new count."""
    now = [0.0]
    said: list[tuple[str, int]] = []
    outage = StoreOutage(
        lambda kind, key, d, n: said.append((kind, n)), every=10.0, clock=lambda: now[0]
    )
    for i in range(250):  # 25 s of failures, one per 0.1 s
        now[0] = i / 10
        outage.failed("k", "refused")
    outage.reached("k")
    outage.failed("k", "refused")
    assert said == [
        ("store_unavailable", 1),
        ("store_unavailable", 101),
        ("store_unavailable", 201),
        ("store_reachable", 250),
        ("store_unavailable", 1),
    ]


def test_an_answer_to_a_call_sent_before_the_outage_does_not_end_it() -> None:
    """A call sent before the first failure that answers after it (it was under way on a
    connection the outage had not cut yet) ends nothing; one sent after the failure does.
    Under load, such a straddling answer used to end the outage at once, so the next
    failure said ``store_unavailable`` a second time."""
    now = [10.0]
    said: list[str] = []
    outage = StoreOutage(lambda kind, key, d, n: said.append(kind), clock=lambda: now[0])
    outage.failed("k3", "refused")  # the outage starts at 10.0
    outage.reached("k1", sent_at=9.9)  # sent before it: no news
    now[0] = 10.1
    outage.failed("k3", "refused")
    assert said == ["store_unavailable"] and outage.ongoing
    outage.reached("k1", sent_at=10.05)  # sent after it began, and answered: it is over
    assert said == ["store_unavailable", "store_reachable"] and not outage.ongoing
