"""An owner killed, paused or blocked at a precise point; a follower finishes the job.

Scenarios 1, 2 and 4 of docs/reliability.md, on SQLite and on Redis, with the fast profile
(lease 2 s, renewal 0.5 s, poll 0.1 s). A is the first owner, running with a FaultPlan;
B is a follower, started first and held back until A owns the job. Every scenario ends
with the history checker (one commit, rising tokens, no acquisition inside a live lease).
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, report
from tests.harness.history import of_kind
from tests.harness.node import NodeProcess

pytestmark = pytest.mark.chaos

TTL, POLL = PROFILE["ttl"], PROFILE["poll"]
SLACK = 0.5
DEAD_OWNER_BOUND = TTL + POLL + SLACK  # takeover after the dead owner's last renewal
KEY = "chaos-job"


async def owner_then_follower(
    cluster: ChaosCluster, faults: str, **owner: float
) -> tuple[NodeProcess, NodeProcess]:
    """B connected and held back; A started and owning the job; then B released."""
    b = await cluster.start_ready("B", [KEY])
    a = await cluster.start("A", [KEY], faults=faults, **owner)
    await a.wait_for_event("acquired", "A to own the job")
    cluster.go()
    return a, b


async def wait_until_stopped(node: NodeProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while node.state() != "T":
        assert time.monotonic() < deadline, f"{node.name} never stopped\n{node.dump()}"
        await asyncio.sleep(0.01)


def last_lease_event(events: list[dict], owner_id: str) -> dict:
    return of_kind(events, "acquired", "renewed", owner_id=owner_id)[-1]


async def test_owner_killed_after_parse_is_taken_over(cluster: ChaosCluster) -> None:
    """An owner SIGKILLed after parse (before persist) is taken over within TTL + poll."""
    a, b = await owner_then_follower(cluster, "after:parse=kill")
    assert await a.exited() == -signal.SIGKILL, a.dump()
    assert await b.exited() == 0, b.dump()
    histories = cluster.histories()
    verdict = await check_job(cluster.store_url, KEY, histories, ttl=TTL)
    assert verdict.committer["node"] == "B"
    assert verdict.record.output == f"{KEY} answered by B"
    assert verdict.calls == {"A": 1, "B": 1}, "the model was called again by the same node"
    owner = of_kind(histories["A"], "acquired")[0]
    assert not of_kind(histories["A"], "committed", "commit_landed")
    taken = of_kind(histories["B"], "acquired")[0]
    assert "(takeover)" in taken["detail"] and taken["token"] > owner["token"]
    after = taken["at"] - last_lease_event(histories["A"], owner["owner_id"])["at"]
    assert after <= DEAD_OWNER_BOUND, f"takeover {after:.2f}s after A's last renewal"
    report("kill after:parse", cluster.store_url, takeover_after_last_renewal=after)


@pytest.mark.parametrize("repeat", range(2))
async def test_owner_killed_after_commit_result_is_reused(
    cluster: ChaosCluster, repeat: int
) -> None:
    """An owner SIGKILLed right after its commit: the follower returns that result at once,
    without calling the model."""
    a, b = await owner_then_follower(cluster, "after_commit=kill", every=0.2)
    landed = await a.wait_for_event("commit_landed", "A's write")
    assert await a.exited() == -signal.SIGKILL, a.dump()
    assert await b.exited() == 0, b.dump()
    histories = cluster.histories()
    verdict = await check_job(cluster.store_url, KEY, histories, ttl=TTL)
    assert verdict.committer["node"] == "A" and verdict.committer["kind"] == "commit_landed"
    assert verdict.record.output == f"{KEY} answered by A"
    assert verdict.calls == {"A": 1, "B": 0}, "the follower called the model again"
    assert not of_kind(histories["B"], "acquired"), "B took over a finished job"
    done = of_kind(histories["B"], "exit")[0]
    assert done["result"] == verdict.record.output
    after = done["at"] - landed["at"]
    assert after <= POLL + SLACK, f"B returned {after:.2f}s after the commit"
    report("kill after_commit", cluster.store_url, follower_done_after_commit=after)


async def test_paused_owner_write_is_refused_by_the_store(cluster: ChaosCluster) -> None:
    """An owner frozen between its own lease check and the write, resumed after a takeover,
    has its write refused by the store (FencingRejected), not by its own check."""
    a, b = await owner_then_follower(cluster, "before_commit=pause")
    paused = await a.wait_for_event("fault", "A to reach its write")
    await wait_until_stopped(a)
    taken = await b.wait_for_event("acquired", "B to take over", timeout=5 * TTL)
    await b.wait_for_event("committed", "B to commit", timeout=5 * TTL)
    assert a.state() == "T", "A was resumed before the takeover"
    a.signal(signal.SIGCONT)
    assert await a.exited() == 0, a.dump()
    assert await b.exited() == 0, b.dump()
    histories = cluster.histories()
    verdict = await check_job(cluster.store_url, KEY, histories, ttl=TTL)
    assert verdict.committer["node"] == "B"
    owner = of_kind(histories["A"], "acquired")[0]
    answers = of_kind(histories["A"], "commit_answer", owner_id=owner["owner_id"])
    assert len(answers) == 1, f"A's write did not reach the store once\n{a.dump()}"
    assert answers[0]["answer"] == "rejected", answers[0]
    assert "FencingRejected" in answers[0]["detail"], answers[0]
    assert "another owner already committed" in answers[0]["detail"], answers[0]
    assert answers[0]["at"] > taken["at"]
    # What the runner reports: `fenced` when it saw the store's answer; `self_fenced` when
    # its keeper noticed the lapsed lease first and cancelled the write in flight.
    seen = of_kind(histories["A"], "fenced", "self_fenced", owner_id=owner["owner_id"])
    assert seen, f"A's runner reported neither fenced nor self_fenced\n{a.dump()}"
    after = taken["at"] - last_lease_event(histories["A"], owner["owner_id"])["at"]
    assert after <= DEAD_OWNER_BOUND, f"takeover {after:.2f}s after A's last renewal"
    report(
        "pause before_commit",
        cluster.store_url,
        takeover_after_last_renewal=after,
        takeover_after_pause=taken["at"] - paused["at"],
        runner_saw=seen[0]["kind"],
    )


async def test_blocked_event_loop_abandons_before_the_write(cluster: ChaosCluster) -> None:
    """An event loop blocked 3 s (longer than the TTL) after parse: on waking, the owner
    fences itself before any side effect; the follower's result is the one stored."""
    a, b = await owner_then_follower(cluster, "after:parse=block:3")
    blocked = await a.wait_for_event("fault", "A to block")
    assert await a.exited() == 0, a.dump()
    assert await b.exited() == 0, b.dump()
    histories = cluster.histories()
    verdict = await check_job(cluster.store_url, KEY, histories, ttl=TTL)
    assert verdict.committer["node"] == "B"
    owner = of_kind(histories["A"], "acquired")[0]
    fenced = of_kind(histories["A"], "self_fenced", owner_id=owner["owner_id"])
    assert fenced, f"A did not fence itself\n{a.dump()}"
    assert fenced[0]["at"] >= blocked["at"] + 3.0 - 0.05
    mine = [e for e in of_kind(histories["A"], "stage") if e["owner_id"] == owner["owner_id"]]
    assert "persist" not in {e["stage"] for e in mine}, "A started persisting after waking"
    assert not of_kind(histories["A"], "fenced"), "A reached the store with a stale write"
    taken = of_kind(histories["B"], "acquired")[0]
    after = taken["at"] - last_lease_event(histories["A"], owner["owner_id"])["at"]
    assert after <= DEAD_OWNER_BOUND, f"takeover {after:.2f}s after A's last renewal"
    report(
        "block after:parse 3s",
        cluster.store_url,
        takeover_after_last_renewal=after,
        self_fenced_after_wake=fenced[0]["at"] - blocked["at"] - 3.0,
    )
