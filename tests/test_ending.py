"""One release/fail path (run/ending.py): the same case ends the same way, and raises the
same exception, from a runner's attempt and from ``client.lease()``."""

from __future__ import annotations

import asyncio

import pytest

import ai_lease
from ai_lease import InputError, Job, JobFailed, LeaseTimings, Pipeline, Stage, StageContext, Status
from ai_lease.failure import FailureKind
from ai_lease.lease.events import Event

FAST = LeaseTimings(
    ttl=1.0, renew_interval=0.2, op_timeout=0.15, poll_interval=0.05, self_fence_margin=0.3
)


async def _bad_input(ctx: StageContext) -> None:
    raise InputError("the input is not a CSV file")


async def test_bad_input_is_job_failed_from_both_owners(sqlite_url: str) -> None:
    events: list[Event] = []
    pipeline = Pipeline([Stage("load", _bad_input)])
    async with ai_lease.connect(
        sqlite_url, timings=FAST, pipeline=pipeline, on_event=events.append
    ) as client:
        with pytest.raises(JobFailed, match="not a CSV") as by_runner:
            await client.run(Job("run-bad", input="x"))
        with pytest.raises(JobFailed, match="not a CSV") as by_lease:
            async with client.lease("lease-bad"):
                raise InputError("the input is not a CSV file")
        for failed in (by_runner.value, by_lease.value):
            assert isinstance(failed.__cause__, InputError)
            assert failed.kind == by_runner.value.kind
        for key in ("run-bad", "lease-bad"):
            record = await client.status(key)
            assert record is not None and record.status is Status.FAILED
            assert record.failure_kind == FailureKind(by_runner.value.kind)
    said = {(e.key, e.kind) for e in events}
    assert {("run-bad", "failed"), ("lease-bad", "failed")} <= said  # both say it


async def test_a_cancelled_owner_hands_back_uncounted_from_both(sqlite_url: str) -> None:
    events: list[Event] = []
    entered = asyncio.Event()

    async def hang(ctx: StageContext) -> None:
        entered.set()
        await asyncio.Event().wait()  # until cancelled

    pipeline = Pipeline([Stage("load", hang)])
    async with ai_lease.connect(
        sqlite_url, timings=FAST, pipeline=pipeline, on_event=events.append
    ) as client:

        async def own_code() -> None:
            async with client.lease("lease-stop"):
                entered.set()
                await asyncio.Event().wait()

        bodies = {"run-stop": lambda: client.run(Job("run-stop", input="")), "lease-stop": own_code}
        for key, body in bodies.items():
            entered.clear()
            task = asyncio.create_task(body())
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await client.status(key)
            assert record is not None and record.status is Status.PENDING, key
            assert record.attempts == 0, key
    interrupted = [e for e in events if e.kind == "released" and e.attrs is not None]
    stepped = {e.key for e in interrupted if e.attrs and e.attrs.get("reason") == "interrupted"}
    assert stepped == {"run-stop", "lease-stop"}
