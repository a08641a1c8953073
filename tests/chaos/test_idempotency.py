"""The same key again: the stored result without a new model call, or a conflict.

Scenario 10, in this process and across processes, on SQLite and on Redis.
"""

from __future__ import annotations

import pytest

from ai_lease import JobConflict, LeaseStore
from ai_lease.job import Job
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job

pytestmark = pytest.mark.chaos

KEY = "same-key"


def job(text: str = "the input") -> Job:
    return Job(KEY, input=text, prompt_text="{{ input }}")


@pytest.mark.parametrize("repeat", range(3))
async def test_resubmitted_key_returns_the_stored_result(store: LeaseStore, repeat: int) -> None:
    """The same key and payload again returns the stored record; the model is not called."""
    first = ScriptedProvider(["first ", "answer"])
    record = await Runner(store, provider=first, config=RunConfig(record_history=False)).run(job())
    again = ScriptedProvider(["second answer"])
    runner = Runner(store, provider=again, config=RunConfig(record_history=False))
    for _ in range(3):
        repeated = await runner.run(job())
        assert (repeated.output, repeated.token) == (record.output, record.token)
    submitted = await runner.submit(job())
    assert submitted.output == record.output
    assert (first.calls, again.calls) == (1, 0)


@pytest.mark.parametrize("repeat", range(3))
async def test_same_key_other_payload_is_a_conflict(store: LeaseStore, repeat: int) -> None:
    """The same key with another payload raises JobConflict, never the old result."""
    await Runner(
        store, provider=ScriptedProvider(["old"]), config=RunConfig(record_history=False)
    ).run(job())
    other = ScriptedProvider(["new"])
    runner = Runner(store, provider=other, config=RunConfig(record_history=False))
    with pytest.raises(JobConflict, match=KEY):
        await runner.run(job("another input"))
    with pytest.raises(JobConflict):
        await runner.submit(job("another input"))
    with pytest.raises(JobConflict):
        await runner.try_run(Job(KEY, input="the input", prompt_text="{{ input }}!"))
    assert other.calls == 0
    stored = await store.get(KEY)
    assert stored is not None and stored.output == "old"


async def test_a_later_process_gets_the_result_without_a_call(cluster: ChaosCluster) -> None:
    """A second process running a finished key returns the stored result; no model call."""
    a = await cluster.start("A", [KEY])
    assert await a.exited() == 0, a.dump()
    b = await cluster.start("B", [KEY])
    assert await b.exited() == 0, b.dump()
    verdict = await check_job(cluster.store_url, KEY, cluster.histories(), ttl=PROFILE["ttl"])
    assert verdict.calls == {"A": 1, "B": 0}
    assert verdict.record.output == f"{KEY} answered by A"
