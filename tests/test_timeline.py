"""The seed's timeline (section 6), end to end: owners and followers in separate OS processes.

Time is compressed (lease 2 s, renewal every 0.5 s, call_ai may go 1 s without progress)
and every scenario runs on SQLite and on Redis. Each node writes a history file
(``tests/harness/node.py``); assertions read those and the store's final record
(``tests/harness/history.py``). Waits poll with bounds; timing assertions use the events'
own timestamps, with slack for scheduling.

The nodes are A (the first owner) and B (a follower, started early but held back until A
owns the job, so it is already following when A's lease could lapse).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ai_lease import Status
from tests.harness.history import (
    check_acquisitions,
    check_invariants,
    last_progress_at,
    of_kind,
    read_record,
)
from tests.harness.node import Cluster, NodeProcess

REAL_TIME = "owners and followers are separate OS processes"


pytestmark = pytest.mark.slow

TTL, RENEW, MNP = 2.0, 0.5, 1.0
SLACK = 0.5  # scheduling slack on top of every timing bound
TAKEOVER_BOUND = TTL + 1.0  # a follower owns the job within one TTL of the last renewal
KEY = "timeline-job"

Events = list[dict[str, Any]]


@pytest.fixture(params=["task", "process"])
async def cluster(
    store_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Cluster]:
    """The nodes of one scenario, with each job's stages in the node's own process
    (``task``) or in a warm child of it (``process``: stopped by the termination ladder)."""
    async with Cluster(
        store_url, KEY, tmp_path, ttl=TTL, renew=RENEW, mnp=MNP, isolation=request.param
    ) as running:
        yield running


def report(cluster: Cluster, scenario: str, **measured: float) -> None:
    """Print the measured latencies (shown with ``pytest -s``)."""
    backend = cluster.store_url.split(":", 1)[0]
    numbers = " ".join(
        f"{name}={value:.2f}s" if isinstance(value, float) else f"{name}={value}"
        for name, value in measured.items()
    )
    print(f"\nTIMELINE {backend:<6} {scenario:<22} {numbers}")


def only(events: Events, what: str) -> dict[str, Any]:
    assert len(events) == 1, f"want exactly one {what}, got {events}"
    return events[0]


async def owner_then_follower(
    cluster: Cluster, behaviour: str, follower: str = "ok"
) -> tuple[NodeProcess, NodeProcess]:
    """Start B held back and A free; release B once A owns the job."""
    b = await cluster.start("B", follower, wait_for_go=True)
    a = await cluster.start("A", behaviour)
    await a.wait_for_event("acquired", "A to own the job")
    cluster.go()
    return a, b


async def exited_cleanly(*nodes: NodeProcess) -> None:
    for node in nodes:
        code = await node.exited()
        assert code == 0, f"node {node.name} exited with {code}\n{node.dump()}"


async def wait_until_stopped(node: NodeProcess, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while node.state() != "T":
        assert time.monotonic() < deadline, f"{node.name} never stopped\n{node.dump()}"
        await asyncio.sleep(0.02)


def assert_stalled_then_taken_over(zombie: Events, follower: Events) -> dict[str, float]:
    """The zombie stops renewing in time and the follower takes over in time."""
    stalled = only(of_kind(zombie, "stalled"), "stall")
    idle = stalled["at"] - last_progress_at([e for e in zombie if e["at"] <= stalled["at"]])
    assert MNP <= idle + 0.05, f"stalled after only {idle:.2f}s without progress"
    assert idle <= MNP + RENEW + SLACK, f"stalled {idle:.2f}s after the last progress"
    renewals = of_kind(zombie, "acquired", "renewed", owner_id=stalled["owner_id"])
    assert all(e["at"] <= stalled["at"] for e in renewals), "the zombie renewed after its stall"
    taken = only(of_kind(follower, "acquired"), "acquisition by the follower")
    assert taken["token"] > stalled["token"]
    assert "(takeover)" in taken["detail"]
    assert of_kind(follower, "following"), "the follower was not waiting before the takeover"
    after_renewal = taken["at"] - renewals[-1]["at"]
    after_stall = taken["at"] - stalled["at"]
    assert after_renewal <= TAKEOVER_BOUND, f"takeover {after_renewal:.2f}s after the last renewal"
    assert after_stall <= TTL + SLACK, f"takeover {after_stall:.2f}s after the stall"
    late = only(of_kind(zombie, "late_commit_rejected"), "rejected late write")
    assert (late["token"], late["owner_id"]) == (stalled["token"], stalled["owner_id"])
    return {
        "stall_after_progress": idle,
        "takeover_after_stall": after_stall,
        "takeover_after_last_renewal": after_renewal,
    }


def awaited_chain(snapshot: str) -> list[str]:
    """A stall snapshot's lines up to its resource figures (a child's ends with them)."""
    lines = snapshot.splitlines()
    return lines[: next((i for i, ln in enumerate(lines) if ln.startswith("rss: ")), None)]


def assert_child_stopped(cluster: Cluster, zombie: Events) -> None:
    """Under process isolation the zombie's stuck child was snapshotted with its figures,
    stopped by SIGTERM and reaped, and is gone; under task isolation no ladder ran."""
    steps = of_kind(zombie, "terminated", "reaped")
    if cluster.isolation == "task":
        assert not steps, steps
        return
    assert [e["kind"] for e in steps] == ["terminated", "reaped"], steps
    assert steps[0]["attrs"]["signal"] == "term"
    (children,) = of_kind(zombie, "children")
    assert steps[0]["attrs"]["pid"] in children["pids"]
    assert not Path(f"/proc/{steps[0]['attrs']['pid']}").exists(), "the stuck child remains"


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


async def assert_no_orphans(node: NodeProcess, timeout: float = 5.0) -> None:
    """After its node was SIGKILLed, no child process of it lives on (a child stuck in
    its stage would otherwise run on, orphaned, for ever)."""
    pids = [pid for e in of_kind(node.events(), "children") for pid in e["pids"]]
    deadline = time.monotonic() + timeout
    while left := [pid for pid in pids if alive(pid)]:
        assert time.monotonic() < deadline, f"children {left} outlived their node"
        await asyncio.sleep(0.05)


async def test_hung_coroutine_is_taken_over(cluster: Cluster) -> None:
    """A coroutine hung in the model call loses its job to a higher token; its late write fails."""
    a, b = await owner_then_follower(cluster, "hang-async")
    await exited_cleanly(a, b)
    histories = cluster.histories()
    record = await check_invariants(cluster.store_url, KEY, histories)
    timings = assert_stalled_then_taken_over(histories["A"], histories["B"])
    assert record.output == "answer from B"
    stalled = only(of_kind(histories["A"], "stalled"), "stall")
    snapshot = record.stall_snapshot or ""
    assert f"token {stalled['token']}" in snapshot, snapshot
    assert "ai_lease/testing/scripted.py" in snapshot, snapshot
    chain = awaited_chain(snapshot)
    assert chain[-2].endswith("in stream"), snapshot  # the scripted stream,
    assert chain[-1].endswith("in wait"), snapshot  # awaiting its Stall()
    assert_child_stopped(cluster, histories["A"])
    report(cluster, "hang-async", **timings)


async def test_stage_blocked_in_thread_is_taken_over(cluster: Cluster) -> None:
    """A sync stage blocked in a thread loses its job; the thread's eventual write is rejected."""
    a, b = await owner_then_follower(cluster, "hang-thread")
    await exited_cleanly(a, b)
    histories = cluster.histories()
    record = await check_invariants(cluster.store_url, KEY, histories)
    timings = assert_stalled_then_taken_over(histories["A"], histories["B"])
    assert record.output == "answer from B"
    snapshot = record.stall_snapshot or ""
    assert "in call_ai_blocking" in snapshot.split("thread", 1)[-1], snapshot
    assert_child_stopped(cluster, histories["A"])
    report(cluster, "hang-thread", **timings)


async def test_killed_owner_is_taken_over(cluster: Cluster) -> None:
    """An owner killed with SIGKILL mid-stream loses its job within one TTL of its last renewal."""
    a, b = await owner_then_follower(cluster, "slow")
    await a.wait_for(
        lambda evs: [e for e in of_kind(evs, "renewed") if e["stage"] == "call_ai"],
        "a renewal while streaming",
    )
    a.signal(signal.SIGKILL)
    killed_at = time.time()
    assert await a.exited() == -signal.SIGKILL
    await assert_no_orphans(a)
    await exited_cleanly(b)
    histories = cluster.histories()
    record = await check_invariants(cluster.store_url, KEY, histories)
    assert record.output == "answer from B"
    assert not of_kind(histories["A"], "exit")
    owner = only(of_kind(histories["A"], "acquired"), "acquisition by A")
    last_renewal = of_kind(histories["A"], "acquired", "renewed")[-1]
    taken = only(of_kind(histories["B"], "acquired"), "acquisition by B")
    assert taken["token"] > owner["token"]
    after_renewal = taken["at"] - last_renewal["at"]
    assert after_renewal <= TAKEOVER_BOUND, f"takeover {after_renewal:.2f}s after the last renewal"
    assert taken["at"] - killed_at <= TAKEOVER_BOUND
    report(
        cluster,
        "sigkill",
        takeover_after_kill=taken["at"] - killed_at,
        takeover_after_last_renewal=after_renewal,
    )


async def test_paused_owner_write_is_rejected(cluster: Cluster) -> None:
    """An owner frozen by SIGSTOP past expiry, resumed after a takeover, cannot commit."""
    a, b = await owner_then_follower(cluster, "pause-before-commit")
    at_commit = await a.wait_for_event("at_commit", "A to reach its write")
    await wait_until_stopped(a)
    taken = await b.wait_for_event("acquired", "B to take over", timeout=TTL * 5)
    assert a.state() == "T", "A was resumed before the takeover"
    a.signal(signal.SIGCONT)
    await a.wait_for_event("late_commit_rejected", "A's write after SIGCONT")
    await exited_cleanly(a, b)
    histories = cluster.histories()
    record = await check_invariants(cluster.store_url, KEY, histories)
    assert record.output == "answer from B"
    owner = only(of_kind(histories["A"], "acquired"), "acquisition by A")
    late = only(of_kind(histories["A"], "late_commit_rejected"), "rejected write")
    assert (late["token"], late["owner_id"]) == (owner["token"], owner["owner_id"])
    assert late["at"] > taken["at"]
    renewals = of_kind(histories["A"], "acquired", "renewed")
    assert renewals[-1]["at"] <= at_commit["at"] + SLACK, "A renewed while frozen"
    assert taken["token"] > owner["token"]
    after_renewal = taken["at"] - renewals[-1]["at"]
    assert after_renewal <= TAKEOVER_BOUND, f"takeover {after_renewal:.2f}s after the last renewal"
    report(
        cluster,
        "sigstop",
        takeover_after_pause=taken["at"] - at_commit["at"],
        takeover_after_last_renewal=after_renewal,
    )


async def test_slow_but_progressing_owner_keeps_its_job(cluster: Cluster) -> None:
    """An owner streaming slowly but steadily for three TTLs is never taken over."""
    a, b = await owner_then_follower(cluster, "slow")
    await exited_cleanly(a, b)
    histories = cluster.histories()
    record = await check_invariants(cluster.store_url, KEY, histories)
    owner = only([e for h in histories.values() for e in of_kind(h, "acquired")], "acquisition")
    assert owner["node"] == "A"
    assert record.output.endswith("answer from A")
    assert not of_kind(histories["A"], "renew_skipped", "renew_refused", "stalled")
    chunks = [e["at"] for e in of_kind(histories["A"], "chunk")]
    gaps = [later - earlier for earlier, later in itertools.pairwise(chunks)]
    assert max(gaps) <= MNP, f"the owner went {max(gaps):.2f}s without progress"
    assert chunks[-1] - owner["at"] >= 2.5 * TTL, "the stream did not outlast the lease"
    assert of_kind(histories["B"], "following"), "B never waited for A"
    assert not of_kind(histories["B"], "stage"), "B ran the job itself"
    report(cluster, "slow-progress", owned_for=chunks[-1] - owner["at"], longest_gap=max(gaps))


async def test_alert_policy_never_hands_over(cluster: Cluster) -> None:
    """Under the alert policy a hung owner keeps its lease, the misses counted, until it dies."""
    cluster.policy = "alert"
    a, b = await owner_then_follower(cluster, "hang-async")
    stalled = await a.wait_for_event("stalled", "A's stall alert")
    assert stalled["detail"].startswith("alert:")
    progress_at = last_progress_at([e for e in a.events() if e["at"] <= stalled["at"]])
    await a.wait_for(
        lambda evs: [e for e in of_kind(evs, "renewed") if e["at"] >= progress_at + 3 * TTL],
        "A to keep renewing for three TTLs",
    )
    assert not b.events("acquired"), f"B took over an alert-mode job\n{cluster.dump()}"
    assert b.events("following")
    record = await read_record(cluster.store_url, KEY)
    assert record is not None
    assert record.status is Status.RUNNING
    assert (record.token, record.owner_id) == (stalled["token"], stalled["owner_id"])
    assert record.missed_renewals > 0
    assert f"token {stalled['token']}" in (record.stall_snapshot or "")

    a.signal(signal.SIGKILL)  # now let the follower finish the job
    assert await a.exited() == -signal.SIGKILL
    await assert_no_orphans(a)
    await exited_cleanly(b)
    histories = cluster.histories()
    final = await check_invariants(cluster.store_url, KEY, histories)
    assert final.output == "answer from B"
    taken = only(of_kind(histories["B"], "acquired"), "acquisition by B")
    last_renewal = of_kind(histories["A"], "renewed")[-1]
    after_renewal = taken["at"] - last_renewal["at"]
    assert after_renewal <= TAKEOVER_BOUND, f"takeover {after_renewal:.2f}s after the last renewal"
    report(
        cluster,
        "alert",
        kept_after_stall=last_renewal["at"] - stalled["at"],
        missed_renewals=record.missed_renewals,
        takeover_after_last_renewal=after_renewal,
    )


def _event(node: str, kind: str, token: int, at: float) -> dict[str, Any]:
    return {"node": node, "kind": kind, "owner_id": f"{node}#1", "token": token, "at": at}


def test_checker_flags_an_acquisition_inside_a_live_lease() -> None:
    """The history checker fails when a second owner acquires while the first's lease lives."""
    histories = {
        "A": [_event("A", "acquired", 1, 100.0), _event("A", "renewed", 1, 101.0)],
        "B": [_event("B", "acquired", 2, 102.0)],  # A's lease runs to 103.0
    }
    with pytest.raises(AssertionError, match="inside the lease"):
        check_acquisitions(histories, ttl=TTL)
    histories["B"] = [_event("B", "acquired", 2, 103.0)]
    check_acquisitions(histories, ttl=TTL)


def test_checker_flags_a_token_that_does_not_rise() -> None:
    """The history checker fails when a later acquisition carries a token that is not higher."""
    histories = {
        "A": [_event("A", "acquired", 5, 100.0)],
        "B": [_event("B", "acquired", 5, 110.0)],
    }
    with pytest.raises(AssertionError, match="is not above"):
        check_acquisitions(histories, ttl=TTL)
