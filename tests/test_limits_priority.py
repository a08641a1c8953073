"""A job's priority under ``[limits]`` (issue 29, fairness): calls waiting for a slot are
served first come, first served, a higher ``Job.priority`` first. The priority travels in
the stored spec (a worker runs a detached job in its turn) but is not part of the payload a
resubmission must match; a job file and ``submit --priority`` set it, bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease import RetryPolicy
from ai_lease.cli.jobfile import load_job_file
from ai_lease.errors import JobSpecError
from ai_lease.job import Job
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.limits import limit_timings
from tests.test_cli_submit import run_cli

REAL_TIME = "the store judges slot leases by its own clock"

LIMIT = CallLimit("scripted", 1, max_wait=30)
TIMINGS = limit_timings(ttl=5.0, call_ai_hard=30)


async def _waiting(store: Any, count: int) -> None:
    """Until ``count`` callers wait for the limit's slot."""
    async with asyncio.timeout(20):
        while True:
            if (await store.slot_state(LIMIT.name)).waiting >= count:
                return
            await asyncio.sleep(0.02)  # real: the runners' asks reach the store


async def test_an_urgent_job_is_served_before_earlier_waiters(slot_store: Any) -> None:
    """With the one slot held, two jobs of priority 0 start waiting, then one of priority 10:
    once the slot is free the urgent one is served first, then the others in their order."""
    taken: list[str] = []

    def seen(event: Event) -> None:
        if event.kind == "slot_taken":
            taken.append(event.key)

    config = RunConfig(
        timings=TIMINGS,
        retry=RetryPolicy(attempts=1),
        call_retry=RetryPolicy(attempts=1),
        limits=CallLimits((LIMIT,)),
    )
    provider = ScriptedProvider(["ok"])
    runner = Runner(slot_store, provider=provider, config=config, hooks=RunHooks(seen))
    holder = SlotHold(slot_store, LIMIT.name, "someone-else", capacity=1, ttl=10, max_wait=1)
    jobs = []
    async with holder:
        for n, (key, priority) in enumerate((("first", 0), ("second", 0), ("urgent", 10))):
            jobs.append(asyncio.ensure_future(runner.run(Job(key, input="x", priority=priority))))
            await _waiting(slot_store, n + 1)
    done = await asyncio.wait_for(asyncio.gather(*jobs), 30)
    assert [d.output for d in done] == ["ok"] * 3
    assert taken == ["urgent", "first", "second"]


def test_priority_is_stored_but_not_part_of_the_payload() -> None:
    """The spec carries a priority other than 0 and gives it back; the fingerprint is the
    same whatever the priority (a follower asking less urgently is no conflict)."""
    urgent, plain = Job("k", input="x", priority=7), Job("k", input="x")
    assert urgent.fingerprint() == plain.fingerprint()
    assert orjson.loads(urgent.to_spec())["priority"] == 7
    assert "priority" not in orjson.loads(plain.to_spec())
    assert Job.from_spec(urgent.to_spec()).priority == 7


@pytest.mark.parametrize("bad", [101, -101, True, 1.5, "9"])
def test_a_priority_out_of_bounds_is_refused(bad: object) -> None:
    with pytest.raises(JobSpecError, match=r"priority must be an integer in -100\.\.100"):
        Job("k", input="x", priority=bad)  # type: ignore[arg-type]


def test_a_job_file_and_the_flag_set_it(tmp_path: Path) -> None:
    """``priority = 5`` in a job file; ``--priority`` wins; a bad one names the field."""
    path = tmp_path / "job.toml"
    path.write_text('key = "k"\ninput = "x"\npriority = 5\n')
    assert load_job_file(path).job.priority == 5
    assert load_job_file(path, {"priority": -3}).job.priority == -3
    path.write_text('key = "k"\ninput = "x"\npriority = "high"\n')
    with pytest.raises(JobSpecError, match="'priority' must be int"):
        load_job_file(path)


def test_submit_detach_stores_the_priority(tmp_path: Path) -> None:
    """``ai-lease submit --detach --priority 9`` records it for workers; 500 is exit 2."""
    job = tmp_path / "job.toml"
    job.write_text('key = "urgent-1"\ninput = "x"\n')
    url = f"sqlite:///{tmp_path / 'ai-lease.db'}"
    env = {"AI_LEASE_STORE__URL": url}
    result = run_cli("submit", str(job), "--detach", "--priority", "9", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr

    async def spec() -> str:
        store = open_store(url)
        try:
            record = await store.get("urgent-1")
            assert record is not None and record.spec is not None
            return record.spec
        finally:
            await store.aclose()

    assert Job.from_spec(asyncio.run(spec())).priority == 9
    bad = run_cli("submit", str(job), "--detach", "--priority", "500", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and "--priority" in bad.stderr
