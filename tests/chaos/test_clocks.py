"""Wall clocks that are off by an hour, or jump by one mid-job, on the owner or the follower.

Scenario 8, on Redis: its leases are judged by the Redis server's own clock, budgets by each
process's monotonic clock, so a process whose ``time.time`` is off (patched in the node
process before ai_lease is imported: ``CHAOS_TIME_SHIFT``) must neither give up early nor
take over a live lease. (On SQLite the store's clock *is* the calling process's wall clock,
shared by every process of the machine, so a per-process shift is not a case it can meet;
see docs/reliability.md.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, report
from tests.harness.history import of_kind
from tests.harness.redis_server import RedisServer

pytestmark = [pytest.mark.chaos, pytest.mark.redis]

TTL, POLL = PROFILE["ttl"], PROFILE["poll"]
SLACK = 0.5
KEY = "clock-job"
HOUR = 3600.0


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis_server.flushall()
    return redis_server.url


@pytest.mark.parametrize(
    ("owner_shift", "follower_shift"),
    [(f"{HOUR}", f"-{HOUR}"), (f"{HOUR}@1.5", f"-{HOUR}@1.5"), (f"-{HOUR}@1.5", f"{HOUR}")],
    ids=["owner+1h/follower-1h", "both-jump-mid-job", "owner-jumps-back/follower+1h"],
)
async def test_wall_clock_off_by_an_hour_changes_nothing(
    redis_url: str, tmp_path: Path, owner_shift: str, follower_shift: str
) -> None:
    """Owner and follower clocks an hour apart (or jumping mid-job): the slow but live
    owner keeps its lease, the follower waits, one acquisition, no early give-up."""
    async with ChaosCluster(redis_url, tmp_path) as cluster:
        b = await cluster.start_ready("B", [KEY], env={"CHAOS_TIME_SHIFT": follower_shift})
        a = await cluster.start(
            "A",
            [KEY],
            env={"CHAOS_TIME_SHIFT": owner_shift},
            calls="slow",
            slow_for=3.5,
            chunks=8,
            job_deadline=20.0,
        )
        await a.wait_for_event("acquired", "A to own the job")
        cluster.go()
        assert await a.exited() == 0, a.dump()
        assert await b.exited() == 0, b.dump()
        histories = cluster.histories()
        verdict = await check_job(redis_url, KEY, histories, ttl=TTL)
    assert [e["node"] for e in verdict.acquisitions] == ["A"], "a false takeover"
    assert verdict.calls == {"A": 1, "B": 0}
    assert of_kind(histories["B"], "following"), "B never waited for A"
    assert not of_kind(histories["A"], "renew_refused", "renew_skipped", "self_fenced")
    shifted = of_kind(histories["A"], "committed")[0]
    report(
        f"clock owner {owner_shift} follower {follower_shift}",
        redis_url,
        owner_event_clock_skew=shifted["event_at"] - shifted["at"],
        renewals=len(of_kind(histories["A"], "renewed")),
    )


async def test_follower_an_hour_behind_takes_over_a_dead_owner_on_time(
    redis_url: str, tmp_path: Path
) -> None:
    """A follower whose clock is an hour behind takes over a SIGKILLed owner within TTL +
    poll of the owner's last renewal: not an hour late, not early."""
    async with ChaosCluster(redis_url, tmp_path) as cluster:
        b = await cluster.start_ready("B", [KEY], env={"CHAOS_TIME_SHIFT": f"-{HOUR}"})
        a = await cluster.start(
            "A", [KEY], env={"CHAOS_TIME_SHIFT": f"{HOUR}"}, calls="slow", slow_for=6.0
        )
        await a.wait_for_event("acquired", "A to own the job")
        cluster.go()
        await a.wait_for(
            lambda evs: [e for e in of_kind(evs, "renewed") if e["stage"] == "call_ai"],
            "A to renew while streaming",
        )
        a.signal(signal.SIGKILL)
        killed_at = time.time()
        assert await a.exited() == -signal.SIGKILL
        assert await b.exited() == 0, b.dump()
        histories = cluster.histories()
        verdict = await check_job(redis_url, KEY, histories, ttl=TTL)
    assert verdict.committer["node"] == "B"
    last = of_kind(histories["A"], "acquired", "renewed")[-1]
    taken = of_kind(histories["B"], "acquired")[0]
    after = taken["at"] - last["at"]
    assert TTL - 0.1 <= after <= TTL + POLL + SLACK, f"takeover {after:.2f}s after renewal"
    report(
        "clock follower -1h, owner killed",
        redis_url,
        takeover_after_last_renewal=after,
        takeover_after_kill=taken["at"] - killed_at,
    )
