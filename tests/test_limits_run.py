"""A job's model call under ``[limits]`` (issue 29): it holds a slot of every matching limit
from the store all runners share, waits its turn without that wait being charged to the
call, gives the slot back when it is stuck, and costs nothing when no limit matches. On
every store, against a loopback server that interrupts a running stream when a second
request arrives (llama.cpp's one-slot server)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ai_lease import LeaseTimings, RetryPolicy, StageBudget
from ai_lease.errors import ConfigError, JobFailed
from ai_lease.job import Job, Status
from ai_lease.lease.call_limits import CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.lease.slots import SlotState
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall
from ai_lease.timeouts import StallPolicy, StreamTimeouts
from tests.harness.limits import limit_timings
from tests.harness.sse_server import Request, Response, Sleep, SSEServer, chat_chunks, sse

REAL_TIME = "the store judges slot leases by its own clock, and the server streams in real time"

ONCE = RetryPolicy(attempts=1)
TIMINGS = limit_timings(ttl=3.0, call_ai_hard=30)


def _config(limit: CallLimit, **kw: Any) -> RunConfig:
    values: dict[str, Any] = {
        "timings": TIMINGS,
        "retry": ONCE,
        "call_retry": ONCE,  # an interrupted stream would fail its job
        "stream_timeouts": StreamTimeouts(first_token=1.0, idle=5, total=30),
        "limits": CallLimits((limit,)),
    }
    return RunConfig(**(values | kw))


def _slow(_: Request) -> Response:
    """An answer whose first token comes 0.4 s after the request."""
    return sse(Sleep(0.4), *chat_chunks(["all ", "of ", "it"]))


async def test_one_slot_keeps_a_one_slot_server_whole_across_runners(slot_store: Any) -> None:
    """Three runners (three nodes' worth) share one slot of the server: six jobs, no stream
    interrupted, each whole; the later ones wait up to 2 s for the slot, far past the 1 s
    first-token budget, and that wait is not charged to them."""
    events: list[Event] = []
    async with SSEServer(responder=_slow, interrupt_on_request=True) as server:
        limit = CallLimit(server.base_url, 1, max_wait=30)
        providers = [OpenAICompatProvider(base_url=server.base_url, model="m") for _ in range(3)]
        runners = [
            Runner(slot_store, provider=p, config=_config(limit), hooks=RunHooks(events.append))
            for p in providers
        ]
        try:
            jobs = [runners[i % 3].run(Job(f"j{i}", input="x")) for i in range(6)]
            done = await asyncio.wait_for(asyncio.gather(*jobs), 60)
        finally:
            for p in providers:
                await p.aclose()
    assert [d.output for d in done] == ["all of it"] * 6
    assert server.interrupted == 0 and len(server.requests) == 6
    assert not [e for e in events if e.kind in ("stream_timeout", "retry", "failed")]
    waits = [e for e in events if e.kind == "slot_wait"]
    said = f"waiting for a slot of {limit.name} ("
    assert waits and all(e.detail.startswith(said) for e in waits)
    taken = [e for e in events if e.kind == "slot_taken"]
    assert len(taken) == 6 and max(e.value or 0 for e in taken) > 1.0  # waited past first_token
    assert await slot_store.slot_state(limit.name) == SlotState(limit.name, 0, 0)


async def test_a_job_that_waits_says_so_in_its_timeline(slot_store: Any) -> None:
    """A call that had to wait leaves one ``slot_wait`` entry in its job's timeline, naming
    the limit and how many were ahead; one that did not wait leaves none."""
    limit = CallLimit("scripted", 1, max_wait=30)
    provider = ScriptedProvider(["a", Pause(0.5), "b"])
    runner = Runner(slot_store, provider=provider, config=_config(limit))
    await asyncio.wait_for(asyncio.gather(*(runner.run(Job(k, input="x")) for k in "pq")), 30)
    entries = {k: (await slot_store.timeline(k))[0] for k in "pq"}
    waited = {k: [e for e in v if e.kind == "slot_wait"] for k, v in entries.items()}
    assert sorted(len(w) for w in waited.values()) == [0, 1]
    (note,) = waited["p"] or waited["q"]
    assert note.detail == "waiting for a slot of scripted (0 ahead)"


async def test_the_wait_pauses_the_stages_hard_deadline(slot_store: Any) -> None:
    """call_ai's hard deadline is 1 s; a job that waits 1.5 s for its slot still runs its
    call whole: the deadline resumes with what it had left once the slot is taken."""
    limit = CallLimit("scripted", 1, max_wait=30)
    timings = LeaseTimings(**{**_timings(), "stage_budgets": {"call_ai": StageBudget(10, 1.0)}})
    config = _config(limit, timings=timings)
    holder = SlotHold(slot_store, limit.name, "someone-else", capacity=1, ttl=5, max_wait=1)
    async with holder:
        runner = Runner(slot_store, provider=ScriptedProvider(["whole"]), config=config)
        job = asyncio.ensure_future(runner.run(Job("late", input="x")))
        await asyncio.sleep(1.5)  # real: the job waits for the slot past the stage's deadline
        assert not job.done()
    done = await asyncio.wait_for(job, 30)
    assert done.output == "whole"


async def test_no_slot_within_max_wait_fails_the_job_naming_the_limit(slot_store: Any) -> None:
    """With every slot held past ``max_wait``, the job fails (after its attempts) saying which
    limit it waited for and for how long."""
    limit = CallLimit("scripted", 1, max_wait=0.5)
    holder = SlotHold(slot_store, limit.name, "someone-else", capacity=1, ttl=5, max_wait=1)
    async with holder:
        runner = Runner(slot_store, provider=ScriptedProvider(["x"]), config=_config(limit))
        with pytest.raises(JobFailed, match=r"no slot of 'scripted' came free in 0\.\d\ds"):
            await asyncio.wait_for(runner.run(Job("waits", input="x")), 30)
    record = await slot_store.get("waits")
    assert record.status is Status.FAILED and "max_wait 0.5s" in (record.last_error or "")


async def test_a_stalled_stream_gives_its_slot_back_within_budget(slot_store: Any) -> None:
    """A stream that stops making progress while it holds the slot: the slot is free again
    within the call stage's no-progress budget (1 s) plus one renew interval (0.5 s), and the
    next job gets it, though the stream guard's own idle timeout (60 s) never fired."""
    limit = CallLimit("scripted", 1, max_wait=30)
    timings = LeaseTimings(**{**_timings(), "stage_budgets": {"call_ai": StageBudget(1.0, 60)}})
    streams = StreamTimeouts(first_token=60, idle=60, total=120)
    config = _config(limit, timings=timings, stream_timeouts=streams)
    stuck = Runner(slot_store, provider=ScriptedProvider(["a", Stall()]), config=config)
    job = asyncio.ensure_future(stuck.run(Job("stuck", input="x")))
    try:
        held_since = await _until_in_use(slot_store, limit.name, 1)
        await _until_in_use(slot_store, limit.name, 0)
        freed_after = time.monotonic() - held_since
        assert freed_after < 1.0 + 0.5 + 1.0  # budget + renew interval + the store's answers
        other = Runner(slot_store, provider=ScriptedProvider(["next"]), config=config)
        assert (await asyncio.wait_for(other.run(Job("next", input="x")), 30)).output == "next"
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_stall_policy_alert_keeps_the_slot_as_it_keeps_the_lease(slot_store: Any) -> None:
    """With ``stall_policy = "alert"`` a stalled job keeps running, so it keeps its slot."""
    limit = CallLimit("scripted", 1, max_wait=30)
    timings = LeaseTimings(**{**_timings(), "stage_budgets": {"call_ai": StageBudget(0.5, 60)}})
    streams = StreamTimeouts(first_token=60, idle=60, total=120)
    config = _config(
        limit, timings=timings, stream_timeouts=streams, stall_policy=StallPolicy.ALERT
    )
    runner = Runner(slot_store, provider=ScriptedProvider(["a", Stall()]), config=config)
    job = asyncio.ensure_future(runner.run(Job("alert", input="x")))
    try:
        await _until_in_use(slot_store, limit.name, 1)
        await asyncio.sleep(2.0)  # real: four budgets of no progress, several renewals
        assert (await slot_store.slot_state(limit.name)).in_use == 1
    finally:
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)


async def test_a_call_no_limit_matches_makes_no_slot_call(slot_store: Any) -> None:
    """Limits that name other providers: the job's call asks the store for nothing."""
    limits = CallLimits((CallLimit("openai:gpt-4o", 1), CallLimit("http://10.0.0.9:8080", 1)))
    asked: list[Any] = []

    async def spy(*args: Any, **kw: Any) -> Any:
        asked.append(args)
        raise AssertionError("no slot should be asked for")

    slot_store.acquire_slot = spy
    config = RunConfig(timings=TIMINGS, retry=ONCE, limits=limits)
    done = await Runner(slot_store, provider=ScriptedProvider(["ok"]), config=config).run(
        Job("free", input="x")
    )
    assert done.output == "ok" and asked == []


def test_a_store_without_slots_is_refused_when_limits_are_set() -> None:
    """Limits on a store that keeps no slots: ConfigError when the runner is built."""

    class NoSlots:
        def __getattr__(self, name: str) -> Any:
            if name.endswith("_slot") or name == "slot_state":
                raise AttributeError(name)
            return lambda *a, **k: None

    config = RunConfig(limits=CallLimits((CallLimit("openai", 2),)))
    with pytest.raises(ConfigError, match="keeps no provider slots"):
        Runner(NoSlots(), provider=ScriptedProvider(["x"]), config=config)  # type: ignore[arg-type]


def slow_scripted() -> ScriptedProvider:
    """The children's provider factory (module level: picklable by reference)."""
    return ScriptedProvider(["slow", Pause(0.3), " answer"])


async def test_under_process_isolation_the_worker_holds_the_slot(store: Any) -> None:
    """``isolation = "process"``: the worker takes the slot around its child's run, so three
    jobs with three children still call one at a time; every job DONE, no slot left held."""
    events: list[Event] = []
    limit = CallLimit("scripted", 1, max_wait=30)
    config = RunConfig(timings=TIMINGS, retry=ONCE, limits=CallLimits((limit,)), trace=False)
    runner = Runner(store, provider=slow_scripted(), config=config, hooks=RunHooks(events.append))
    worker = Worker(
        store,
        runner,
        concurrency=3,
        sweep_interval=0.05,
        grace=1.0,
        worker_id="w1",
        on_event=events.append,
        isolation="process",
        provider_factory=slow_scripted,
        terminate_grace=1.0,
    )
    keys = ["i0", "i1", "i2"]
    for key in keys:
        await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))
    task = asyncio.ensure_future(worker.run())
    try:
        deadline = time.monotonic() + 60
        while not all(r is not None and r.status.terminal for r in await _records(store, keys)):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)  # real: children answer in real time
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert [r.output for r in await _records(store, keys)] == ["slow answer"] * 3
    held, most = 0, 0
    for event in events:
        held += {"slot_taken": 1, "slot_released": -1}.get(event.kind, 0)
        most = max(most, held)
    assert most == 1 and held == 0
    assert await store.slot_state(limit.name) == SlotState(limit.name, 0, 0)


async def _records(store: Any, keys: list[str]) -> list[Any]:
    return [await store.get(key) for key in keys]


def _timings() -> dict[str, Any]:
    return {
        "ttl": TIMINGS.ttl,
        "renew_interval": TIMINGS.renew_interval,
        "op_timeout": TIMINGS.op_timeout,
        "poll_interval": TIMINGS.poll_interval,
        "self_fence_margin": TIMINGS.self_fence_margin,
    }


async def _until_in_use(store: Any, limit: str, count: int, within: float = 10.0) -> float:
    """Poll the limit until ``count`` slots are in use; return when (monotonic)."""
    deadline = time.monotonic() + within
    while (await store.slot_state(limit)).in_use != count:
        assert time.monotonic() < deadline, f"{limit}: never {count} in use"
        await asyncio.sleep(0.02)  # real: the store's own clock decides
    return time.monotonic()
