"""What a user sees of a job waiting for a slot (issue 29): ``ai-lease status`` shows its
step as ``slot_wait`` and a ``waiting`` row naming the limit and how many were ahead (and
``--json`` a ``waiting`` field), and so does the dashboard's job page, on every store; once
the slot is taken the row is gone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
from click.testing import CliRunner

from ai_lease import LeaseTimings, RetryPolicy, StageBudget
from ai_lease.cli.app import main
from ai_lease.job import Job, Status
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.testing.scripted import ScriptedProvider
from tests.test_ui_app import serving

REAL_TIME = "the owner publishes its step at its renewals, every 0.5 s of real time"

LIMIT = CallLimit("scripted", 1, max_wait=30)
CONFIG = RunConfig(
    timings=LeaseTimings(
        ttl=3.0,
        renew_interval=0.5,
        op_timeout=0.4,
        poll_interval=0.05,
        self_fence_margin=0.5,
        stage_budgets={"call_ai": StageBudget(10, 30)},
    ),
    retry=RetryPolicy(attempts=1),
    limits=CallLimits((LIMIT,)),
)


async def _status(store_url: str, key: str, *args: str) -> str:
    """``ai-lease --store URL status KEY [args]`` (off the loop: the CLI runs its own)."""
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["--store", store_url, "status", key, *args]
    )
    assert result.exit_code == 0, result.output
    return result.output


async def _until_stage(store: Any, key: str, stage: str) -> None:
    deadline = time.monotonic() + 20
    while (job := await store.get(key)) is None or job.stage != stage:
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.05)  # real: the owner renews in real time


async def test_status_says_what_a_waiting_job_waits_for(store_url: str) -> None:
    store = open_store(store_url, op_timeout=2.0, poll_interval=0.05)
    try:
        holder = SlotHold(store, LIMIT.name, "someone-else", capacity=1, ttl=5, max_wait=1)
        async with holder:
            runner = Runner(store, provider=ScriptedProvider(["whole"]), config=CONFIG)
            job = asyncio.ensure_future(runner.run(Job("patient", input="x")))
            await _until_stage(store, "patient", "slot_wait")
            text = await _status(store_url, "patient")
            as_json = orjson.loads(await _status(store_url, "patient", "--json"))
            async with serving(store) as base, httpx.AsyncClient(base_url=base) as http:
                page = (await http.get("/jobs/patient")).text
        done = await asyncio.wait_for(job, 30)
        after = await _status(store_url, "patient")
    finally:
        await store.aclose()
    rows = dict(line.split(None, 1) for line in text.splitlines() if line.strip())
    assert rows["stage"].startswith("slot_wait")
    assert rows["waiting"].startswith("waiting for a slot of scripted (0 ahead), since "), text
    assert as_json["waiting"].startswith("waiting for a slot of scripted (0 ahead)")
    assert as_json["stage"] == "slot_wait"
    assert '<dt>waiting</dt><dd id="waiting">waiting for a slot of scripted (0 ahead)</dd>' in page
    assert done.status is Status.DONE and done.output == "whole"
    assert "waiting" not in after and "DONE" in after
