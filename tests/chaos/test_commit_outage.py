"""A store that refuses and resets connections just as the owner commits: the finished
answer is resent, fenced, while the lease is valid, and the model is called once.

The store sits behind a :class:`RefusingProxy`; the owner's ``before_commit`` fault point
switches it to refusing (every open connection reset, new ones refused) for a window shorter
than what is left of the lease. The commit is idempotent on its fence, so a resend that
finds its own result already stored is the success it looks like.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from ai_lease import LeaseTimings, StageBudget
from ai_lease.job import Job, Status
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.testing.scripted import ScriptedProvider
from ai_lease.timeouts import RetryPolicy
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer
from tests.harness.refusing_proxy import RefusingProxy

pytestmark = pytest.mark.chaos

TTL, RENEW, OP = 4.0, 1.0, 0.3


def through(url: str, port: int) -> str:
    """``url`` with its port replaced by the proxy's."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit(":", 1)[0] + f":{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture(params=["redis", "postgres"])
async def proxied(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RefusingProxy, str]]:
    """A proxy in front of a real Redis or PostgreSQL, and the store URL through it."""
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        redis.flushall()
        url, port = redis.url, redis.port
    else:
        pg: PostgresServer = request.getfixturevalue("pg_server")
        pg.terminate_backends()
        pg.reset_all()
        url, port = pg.url, pg.port
    async with RefusingProxy("127.0.0.1", port) as proxy:
        yield proxy, through(url, proxy.port)


def timings() -> LeaseTimings:
    budgets = dict(LeaseTimings().stage_budgets)
    budgets["call_ai"] = StageBudget(3.0, 30.0)
    return LeaseTimings(
        ttl=TTL,
        renew_interval=RENEW,
        op_timeout=OP,
        poll_interval=0.1,
        self_fence_margin=1.0,
        stage_budgets=budgets,
    )


class Outage:
    """The fault hook: at ``before_commit``, refuse for ``seconds`` (in the background);
    ``drop``: forward the commit but drop every reply (and close) for ``seconds`` instead."""

    def __init__(self, proxy: RefusingProxy, seconds: float, *, drop: bool = False) -> None:
        self.proxy, self.seconds, self.drop = proxy, seconds, drop
        self.window: asyncio.Task[None] | None = None
        self.started_at = 0.0

    async def __call__(self, point: str) -> None:
        if point == "before_commit" and self.window is None:
            self.started_at = time.monotonic()
            self.window = asyncio.create_task(self._fault())

    async def _fault(self) -> None:
        if not self.drop:
            await self.proxy.refuse_for(self.seconds)
            return
        self.proxy.drop_replies_then_close()
        await asyncio.sleep(self.seconds)
        self.proxy.heal()

    async def aclose(self) -> None:
        if self.window is not None:
            await self.window


async def run_through_outage(
    proxy: RefusingProxy, url: str, seconds: float, *, drop: bool = False
) -> tuple[Any, ScriptedProvider, list[Event]]:
    store = open_store(url, op_timeout=OP)
    provider = ScriptedProvider(["the ", "answer"])
    events: list[Event] = []
    outage = Outage(proxy, seconds, drop=drop)
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(
            timings=timings(),
            retry=RetryPolicy(attempts=3, initial=0.2),
            record_history=False,
            trace=False,
            node_id="me",
        ),
        hooks=RunHooks(on_event=events.append, fault=outage),
    )
    try:
        async with asyncio.timeout(30):
            record = await runner.run(Job("k", input="x", prompt_text="{{ input }}"))
    finally:
        await outage.aclose()
        await store.aclose()
    return record, provider, events


def story(events: list[Event]) -> str:
    return "\n".join(f"{e.kind} {e.owner_id} {e.token}: {e.detail}" for e in events)


async def test_commit_through_a_refuse_and_reset_window_calls_the_model_once(
    proxied: tuple[RefusingProxy, str],
) -> None:
    """Connections reset and refused for 1.5 s as the owner commits (its lease has ~4 s
    left): the commit is resent until it lands, the job is DONE, the model was called once."""
    proxy, url = proxied
    record, provider, events = await run_through_outage(proxy, url, 1.5)
    assert record.status is Status.DONE and record.output == "the answer"
    assert provider.calls == 1, story(events)
    assert record.attempts == 1, record
    acquired = [e for e in events if e.kind == "acquired"]
    assert len(acquired) == 1, story(events)


async def test_commit_whose_replies_are_lost_is_resent_and_finds_its_own_result(
    proxied: tuple[RefusingProxy, str],
) -> None:
    """Every reply is dropped for 1 s as the owner commits (the first send lands): a
    resend finds its own result stored, which is success: DONE, one model call."""
    proxy, url = proxied
    record, provider, events = await run_through_outage(proxy, url, 1.0, drop=True)
    assert record.status is Status.DONE and record.output == "the answer"
    assert provider.calls == 1, story(events)
    assert record.attempts == 1, record


async def test_commit_outage_past_the_lease_releases_nothing(
    proxied: tuple[RefusingProxy, str],
) -> None:
    """Refused for longer than the lease (6 s, TTL 4 s): the owner stops resending once its
    lease may have lapsed and releases nothing; the job is run again only after that lapse
    and ends DONE with one result."""
    proxy, url = proxied
    started = time.monotonic()
    record, provider, events = await run_through_outage(proxy, url, 6.0)
    assert record.status is Status.DONE and record.output == "the answer"
    first = next(e for e in events if e.kind == "acquired").owner_id
    assert not [e for e in events if e.kind == "released" and e.owner_id == first], story(events)
    assert time.monotonic() - started >= TTL, story(events)
    assert provider.calls <= 2, story(events)
