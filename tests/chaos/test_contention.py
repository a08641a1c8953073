"""Many processes at once: a worker told to stop mid-job, and a thundering herd of owners.

Scenario 5: a real ``Worker`` process (signal handlers installed, as ``ai-lease worker``
runs) gets SIGTERM mid-job with a small grace: it releases what it still holds and another
worker takes over after one sweep/poll, not after a lease TTL. Scenario 6: 10 processes
start the same 20 jobs at the same wall-clock instant: one live holder and one commit per
key. Both on SQLite and on Redis.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from ai_lease import LeaseStore, Status
from ai_lease.job import Job
from ai_lease.run.runner import Runner
from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, key_view, report
from tests.harness.history import of_kind
from tests.harness.worker_proc import Workers

pytestmark = pytest.mark.chaos

TTL, POLL = PROFILE["ttl"], PROFILE["poll"]
SWEEP = 0.2
SLACK = 0.5


async def wait_done(store: LeaseStore, keys: list[str], dump: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = set(keys)
    while left:
        for key in sorted(left):
            record = await store.get(key)
            if record is not None and record.status is Status.FAILED:
                raise AssertionError(f"{key} FAILED: {record.last_error}")
            if record is not None and record.status is Status.DONE:
                left.discard(key)
        assert time.monotonic() < deadline or not left, f"not DONE: {sorted(left)}\n{dump}"
        await asyncio.sleep(0.05)


async def test_sigterm_hands_a_running_job_over_after_a_poll(
    store_url: str, store: LeaseStore, tmp_path: Path
) -> None:
    """SIGTERM on a worker mid-job (grace 0.3 s): it releases the job and exits 0; another
    worker owns the job within a sweep + poll of the release, far less than a TTL."""
    async with Workers(store_url, tmp_path, ttl=TTL, renew=PROFILE["renew"], sweep=SWEEP) as ws:
        # A's jobs stream for 30 s, so both are still running when the signal comes, however
        # long B takes to start on a loaded machine; the grace ends them long before.
        a = await ws.start_ready("A", concurrency=2, job_seconds=30.0, grace=0.3)
        keys = ["term-1", "term-2"]
        runner = Runner(store)
        for key in keys:
            await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))
        await a.wait_for(
            lambda evs: len({e["key"] for e in of_kind(evs, "call")}) == 2, "A to run both jobs"
        )
        b = await ws.start_ready("B", concurrency=4, job_seconds=0.3)
        a.signal(signal.SIGTERM)
        signalled_at = time.time()
        assert await a.exited(15) == 0, a.dump()
        await wait_done(store, keys, ws.dump(), timeout=20)
        b.signal(signal.SIGTERM)
        assert await b.exited(15) == 0, b.dump()
        histories = ws.histories()
        delays = []
        for key in keys:
            verdict = await check_job(store_url, key, histories, ttl=TTL)
            assert verdict.committer["node"] == "B"
            view = key_view(histories, key)
            released = of_kind(view["A"], "released")
            assert released, f"A did not release {key}\n{a.dump()}"
            taken = of_kind(view["B"], "acquired")[0]
            delays.append(taken["at"] - released[0]["at"])
    released_at = min(e["at"] for e in of_kind(histories["A"], "released"))
    report(
        "sigterm worker (grace 0.3s)",
        store_url,
        takeover_after_release=max(delays),
        release_after_signal=released_at - signalled_at,
    )
    assert max(delays) <= SWEEP + POLL + SLACK < TTL, f"taken over {delays}s after release"


async def test_herd_of_ten_processes_one_holder_per_key(
    cluster: ChaosCluster, store: LeaseStore
) -> None:
    """10 processes start the same 20 jobs at the same instant: no two live holders of a
    key, one commit and one model call per acquisition."""
    keys = [f"herd-{i:02d}" for i in range(20)]
    names = [f"N{i}" for i in range(10)]
    await asyncio.gather(*(cluster.start_ready(name, keys) for name in names))
    start_at = time.time() + 0.3
    cluster.go(at=start_at)
    for name in names:
        await cluster.nodes[name].exited(60)
    histories = cluster.histories()
    # A first acquire that times out under the herd's load makes run() give up at once,
    # even when it landed (BUG_FIRST_ACQUIRE, pinned in test_store_blips.py): if every run
    # of a key gave up, its orphan lease is left to a later node, as a worker would.
    # Anything else is a failure.
    gave_up = [e for h in histories.values() for e in of_kind(h, "exit") if e["error"]]
    for exit_line in gave_up:
        assert exit_line["error"].startswith("StoreUnavailable: "), exit_line
        assert "during acquire" in exit_line["error"], exit_line
    left = []
    for key in keys:
        record = await store.get(key)
        if record is None or record.status is not Status.DONE:
            left.append(key)
    if left:
        late = await cluster.start("late", left)
        assert await late.exited(60) == 0, late.dump()
        histories = cluster.histories()
    owners = set()
    for key in keys:
        verdict = await check_job(cluster.store_url, key, histories, ttl=TTL)
        assert verdict.total_calls == len(verdict.acquisitions) == 1, verdict.acquisitions
        owners.add(verdict.committer["node"])
    finished = max(e["at"] for h in histories.values() for e in of_kind(h, "exit")) - start_at
    report(
        "herd 10 procs x 20 keys",
        cluster.store_url,
        distinct_owners=len(owners),
        runs_given_up=len(gave_up),
        keys_left_orphaned=len(left),
        all_done_after=finished,
    )
