"""Store blips at a precise moment, in this process: a lost acquire reply, a hung renewal,
a store that fails one call while a follower waits.

The network scenarios (test_store_faults.py) show these on a real Redis through a proxy;
here each is pinned on both stores with a thin wrapper at the store boundary that makes
one operation land but lose its answer, or hang until its op timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ai_lease import (
    LeaseStore,
    LeaseTimings,
    ProviderError,
    StageBudget,
    StoreUnavailable,
)
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, Raise, ScriptedProvider
from ai_lease.timeouts import RetryPolicy
from tests.harness.chaos_cluster import report

pytestmark = pytest.mark.chaos

TTL, RENEW, POLL = 2.0, 0.5, 0.1

BUG_FIRST_ACQUIRE = (
    "ai_lease/runner.py Runner._loop: a StoreUnavailable before the first answer is raised "
    "as a configuration error even when the acquire landed (lost reply)"
)
BUG_FOLLOWER_GIVES_UP = (
    "ai_lease/runner.py Runner._loop: reached_store is only set when _compete returns; a "
    "follower waits inside acquire_or_follow, so one store blip makes run() raise"
)
BUG_GHOST_LEASE = (
    "ai_lease/runner.py Runner._compete: a fresh owner id per call, so after an acquire whose "
    "reply was lost the runner follows its own orphan lease for a whole TTL"
)
BUG_LATE_SELF_FENCE = (
    "ai_lease/keeper.py LeaseKeeper.run/_renew: the self-fence point is only checked between "
    "renewal attempts, so a renewal hung until op_timeout delays the self-fence by up to "
    "op_timeout (eating the safety margin)"
)


class BlipStore:
    """``store``, except that chosen calls of an operation fail with StoreUnavailable:
    ``land`` ones after the store applied them (a lost reply), the others before, and
    ``hang_renewals_after`` makes every later renewal hang until the op timeout."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        lost_acquire_replies: set[int] = frozenset(),  # type: ignore[assignment]
        failed_acquires: set[int] = frozenset(),  # type: ignore[assignment]
        hang_renewals_after: int | None = None,
        op_timeout: float = 0.4,
    ) -> None:
        self._store = store
        self.lost, self.failed = lost_acquire_replies, failed_acquires
        self.hang_after, self.op_timeout = hang_renewals_after, op_timeout
        self.acquires = self.renewals = 0
        self.renewals_sent: list[float] = []  # monotonic send time of each answered renewal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def acquire(self, key: str, owner_id: str, **kwargs: Any) -> Any:
        self.acquires += 1
        if self.acquires in self.failed:
            raise StoreUnavailable("blip", "acquire", "injected: no answer")
        outcome = await self._store.acquire(key, owner_id, **kwargs)
        if self.acquires in self.lost:
            raise StoreUnavailable("blip", "acquire", "injected: the reply was lost")
        return outcome

    async def renew(self, fence: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        sent = time.monotonic()
        if self.hang_after is not None and self.renewals > self.hang_after:
            await asyncio.sleep(self.op_timeout)
            raise StoreUnavailable("blip", "renew", f"no answer within {self.op_timeout:g}s")
        answer = await self._store.renew(fence, **kwargs)
        self.renewals_sent.append(sent)
        return answer


def timings(**overrides: Any) -> LeaseTimings:
    budgets = dict(LeaseTimings().stage_budgets)
    budgets["call_ai"] = StageBudget(3.0, 60.0)
    values: dict[str, Any] = dict(
        ttl=TTL,
        renew_interval=RENEW,
        op_timeout=0.4,
        poll_interval=POLL,
        self_fence_margin=TTL / 4,
        stage_budgets=budgets,
    )
    return LeaseTimings(**{**values, **overrides})


def runner(store: Any, provider: Any, events: list[Event], **lease: Any) -> Runner:
    return Runner(
        store,
        provider=provider,
        config=RunConfig(
            timings=timings(**lease),
            retry=RetryPolicy(attempts=5, initial=1.0),
            record_history=False,
            trace=False,
            node_id="me",
        ),
        hooks=RunHooks(on_event=events.append),
    )


def job(key: str) -> Job:
    return Job(key, input=key, prompt_text="{{ input }}")


async def test_lost_reply_of_the_first_acquire_is_retried(store: LeaseStore) -> None:
    """The very first acquire lands but its reply is lost: the runner retries (the same
    owner id gets the same lease back) and finishes, without waiting out a TTL."""
    blip = BlipStore(store, lost_acquire_replies={1})
    events: list[Event] = []
    started = time.monotonic()
    async with asyncio.timeout(20):
        record = await runner(blip, ScriptedProvider(["fine"]), events).run(job("k1"))
    took = time.monotonic() - started
    assert record.output == "fine"
    assert took < TTL, f"took {took:.2f}s: the orphan lease was waited out"


async def test_lost_acquire_reply_is_not_followed_as_a_ghost(store: LeaseStore) -> None:
    """After a failed attempt, the next acquire lands but its reply is lost: the runner must
    not then wait a whole TTL for the lease it holds itself."""
    provider = ScriptedProvider(["x"])
    failing = ScriptedProvider([Raise(ProviderError("broken", retryable=True, partial=True))])
    calls = 0

    class FailOnce:
        name = "fail-once"

        def stream(self, request: Any) -> Any:
            nonlocal calls
            calls += 1
            return (failing if calls == 1 else provider).stream(request)

        async def aclose(self) -> None:
            pass

    blip = BlipStore(store, lost_acquire_replies={2})
    events: list[Event] = []
    async with asyncio.timeout(20):
        record = await runner(blip, FailOnce(), events).run(job("k2"))
    assert record.output == "x"
    ghosts = [e for e in events if e.kind == "following" and (e.owner_id or "").startswith("me#")]
    assert not ghosts, f"followed its own lease: {[e.detail for e in ghosts]}"


async def test_follower_survives_a_store_blip(store: LeaseStore) -> None:
    """A follower whose store fails once while it waits keeps following and returns the
    owner's result."""
    owned = await store.acquire("k3", "other-owner", ttl=3.0, max_no_progress=5.0)
    blip = BlipStore(store, failed_acquires={2})
    events: list[Event] = []

    async def owner_commits() -> None:
        await asyncio.sleep(1.0)
        await store.commit(owned.fence, '"from the owner"')  # type: ignore[union-attr]

    async with asyncio.timeout(20), asyncio.TaskGroup() as tg:
        tg.create_task(owner_commits())
        following = tg.create_task(runner(blip, ScriptedProvider(["x"]), events).run(job("k3")))
    assert following.result().output == "from the owner"


class Slow:
    """A model streaming one chunk every 0.2 s for ``seconds``."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        steps: list[Any] = []
        for i in range(int(seconds / 0.2)):
            steps += [Pause(0.2), f"{i} "]
        self.inner = ScriptedProvider(steps)

    def stream(self, request: Any) -> Any:
        return self.inner.stream(request)

    async def aclose(self) -> None:
        pass


async def self_fence_lateness(store: LeaseStore, **lease: float) -> tuple[float, float]:
    """Renewals hang (until the op timeout) from the third on; returns how long after the
    last answered renewal was sent the owner fenced itself, and when it should have."""
    blip = BlipStore(store, hang_renewals_after=2, op_timeout=lease["op_timeout"])
    seen: list[tuple[float, Event]] = []
    fenced = asyncio.Event()

    def record(event: Event) -> None:
        seen.append((time.monotonic(), event))
        if event.kind == "self_fenced":
            fenced.set()

    owner = Runner(
        blip,  # type: ignore[arg-type]
        provider=Slow(6.0),
        config=RunConfig(timings=timings(**lease), record_history=False, trace=False),
        hooks=RunHooks(on_event=record),
    )
    task = asyncio.create_task(owner.run(job("k4")))
    try:
        async with asyncio.timeout(10):
            await fenced.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    fenced_at = next(at for at, e in seen if e.kind == "self_fenced")
    due = lease["ttl"] - lease["self_fence_margin"]
    return fenced_at - blip.renewals_sent[-1], due


async def test_self_fence_lands_before_the_lease_lapses(sqlite_store: LeaseStore) -> None:
    """Renewals hang until the op timeout: the owner fences itself before its lease can
    have lapsed (store lapse: TTL after the last answered renewal was sent)."""
    lease = dict(ttl=TTL, renew_interval=RENEW, op_timeout=0.4, self_fence_margin=0.5)
    after, due = await self_fence_lateness(sqlite_store, **lease)
    assert after < TTL, f"fenced {after:.2f}s after the last renewal: past the lease"
    report("hung renewals: self-fence", "sqlite", fenced_after=after, due=due)


async def test_self_fence_is_not_delayed_by_a_hung_renewal(sqlite_store: LeaseStore) -> None:
    """The self-fence fires at its point (TTL - margin after the last answered renewal was
    sent, within 0.1 s) even while a renewal attempt is hanging."""
    # The fence point (1.55 s) falls 50 ms into the renewal attempt started at 1.5 s.
    lease = dict(ttl=TTL, renew_interval=RENEW, op_timeout=0.45, self_fence_margin=0.45)
    after, due = await self_fence_lateness(sqlite_store, **lease)
    assert after <= due + 0.1, f"fenced {after:.2f}s after the last renewal, due at {due:.2f}s"
