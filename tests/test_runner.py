"""The single-flight runner in one process, on both stores: dedupe, retries, failures."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from ai_lease import (
    JobConflict,
    JobDeadlineExceeded,
    JobFailed,
    JobSpecError,
    LeaseStore,
    LeaseTimings,
    ProviderError,
    RetryPolicy,
    StageBudget,
    Status,
)
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline, Stage
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall

FAST = LeaseTimings(
    ttl=1.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.2,
    stage_budgets={"call_ai": StageBudget(0.5, 10)},
)
QUICK_RETRY = RetryPolicy(attempts=3, initial=0.05, max_backoff=0.1)
NO_CALL_RETRY = RetryPolicy(attempts=1)


async def test_concurrent_runs_share_one_owner_and_one_call(store: LeaseStore) -> None:
    """Five runners on one key: one provider call, all five get the same stored result."""
    provider = ScriptedProvider(["one ", Pause(0.1), "answer"])
    runners = [
        Runner(store, provider=provider, config=RunConfig(timings=FAST, node_id=f"n{i}"))
        for i in range(5)
    ]
    records = await asyncio.gather(*(r.run(Job("k", input="x")) for r in runners))
    assert provider.calls == 1
    assert {r.output for r in records} == {"one answer"}
    assert {(r.owner_id, r.token) for r in records} == {(records[0].owner_id, records[0].token)}


async def test_stored_result_is_returned_without_a_new_call(store: LeaseStore) -> None:
    """Resubmitting a finished job returns its result and never calls the provider again."""
    first = ScriptedProvider(["done"])
    await Runner(store, provider=first, config=RunConfig(timings=FAST)).run(Job("k", input="x"))
    second = ScriptedProvider(["other"])
    record = await Runner(store, provider=second, config=RunConfig(timings=FAST)).run(
        Job("k", input="x")
    )
    assert record.output == "done" and second.calls == 0


async def test_same_key_different_payload_is_a_conflict(store: LeaseStore) -> None:
    """The same key with another payload is a conflict error, never the old result."""
    await Runner(store, provider=ScriptedProvider(["a"]), config=RunConfig(timings=FAST)).run(
        Job("k", input="x")
    )
    with pytest.raises(JobConflict):
        await Runner(store, provider=ScriptedProvider(["b"]), config=RunConfig(timings=FAST)).run(
            Job("k", input="y")
        )


class Flaky:
    """Fails the first ``n`` calls with a retryable error, then answers."""

    name = "flaky"

    def __init__(self, n: int, retryable: bool = True) -> None:
        self.n, self.retryable, self.calls = n, retryable, 0

    async def stream(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls <= self.n:
            raise ProviderError("HTTP 503 overloaded", retryable=self.retryable, status=503)
        async for delta in ScriptedProvider(["recovered"]).stream(request):
            yield delta

    async def complete(self, request):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


async def test_retryable_failure_is_retried_then_succeeds(store: LeaseStore) -> None:
    """Two transient failures, then success on the third attempt."""
    provider = Flaky(2)
    record = await Runner(
        store,
        provider=provider,
        config=RunConfig(timings=FAST, retry=QUICK_RETRY, call_retry=NO_CALL_RETRY),
    ).run(Job("k", input="x"))
    assert record.output == "recovered" and provider.calls == 3 and record.attempts == 3


async def test_transient_call_failures_are_retried_within_one_attempt(store: LeaseStore) -> None:
    """Call-level retries absorb transient errors without a new job attempt."""
    provider = Flaky(2)
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(
            timings=FAST, call_retry=RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
        ),
    )
    record = await runner.run(Job("k", input="x"))
    assert record.output == "recovered" and provider.calls == 3 and record.attempts == 1


async def test_attempts_run_out_into_failed(store: LeaseStore) -> None:
    """A job that keeps failing ends FAILED with the last error after the last attempt."""
    provider = Flaky(99)
    with pytest.raises(JobFailed, match=r"3 attempts.*503"):
        await Runner(
            store,
            provider=provider,
            config=RunConfig(timings=FAST, retry=QUICK_RETRY, call_retry=NO_CALL_RETRY),
        ).run(Job("k", input="x"))
    assert provider.calls == 3
    job = await store.get("k")
    assert job is not None and job.status is Status.FAILED


async def test_non_retryable_failure_fails_at_once(store: LeaseStore) -> None:
    """A 401-like error is not retried: FAILED after one call, with the provider's message."""
    provider = Flaky(99, retryable=False)
    with pytest.raises(JobFailed, match="overloaded"):
        await Runner(
            store,
            provider=provider,
            config=RunConfig(timings=FAST, retry=QUICK_RETRY, call_retry=NO_CALL_RETRY),
        ).run(Job("k", input="x"))
    assert provider.calls == 1


async def test_missing_template_variable_fails_before_recording(store: LeaseStore) -> None:
    """Bad input (a template variable nobody passed) fails before the job is recorded."""
    provider = ScriptedProvider(["never"])
    with pytest.raises(JobSpecError, match="'audience' is undefined"):
        await Runner(store, provider=provider, config=RunConfig(timings=FAST)).run(
            Job("k", input="x", prompt_text="Explain {{ input }} to {{ audience }}")
        )
    assert provider.calls == 0 and await store.get("k") is None


async def test_zombie_provider_is_taken_over_in_process(store: LeaseStore) -> None:
    """A stream that hangs stalls its owner; a second runner takes over and finishes."""
    stalled = asyncio.Event()
    zombie = Runner(
        store,
        provider=ScriptedProvider(["x", Stall()]),
        config=RunConfig(timings=FAST, node_id="z"),
        hooks=RunHooks(on_event=lambda e: stalled.set() if e.kind == "stalled" else None),
    )
    good = Runner(
        store, provider=ScriptedProvider(["good"]), config=RunConfig(timings=FAST, node_id="g")
    )
    zombie_run = asyncio.create_task(zombie.run(Job("k", input="x")))
    # real: a real store answers (SQLite from its thread, or a server)
    await asyncio.sleep(0.1)
    good_run = asyncio.create_task(good.run(Job("k", input="x")))
    await asyncio.wait_for(stalled.wait(), 5)
    zombie_run.cancel()  # the zombie's node stays out of the race from here on
    record = await good_run
    assert record.output == "good" and (record.owner_id or "").startswith("g#")
    assert record.takeovers == 1 and record.attempts == 2
    with pytest.raises(asyncio.CancelledError):
        await zombie_run


async def test_job_deadline_ends_failed(store: LeaseStore) -> None:
    """A job past its total deadline ends FAILED with the reason, not hanging forever."""
    timings = LeaseTimings(
        ttl=1.0,
        renew_interval=0.2,
        op_timeout=0.15,
        poll_interval=0.05,
        self_fence_margin=0.2,
        job_deadline=0.6,
        stage_budgets={"call_ai": StageBudget(60, 60)},
    )
    runner = Runner(
        store,
        provider=ScriptedProvider(["slow", Pause(0.2)] * 20),
        config=RunConfig(timings=timings),
    )
    with pytest.raises(JobDeadlineExceeded):
        await runner.run(Job("k", input="x"))
    job = await store.get("k")
    assert job is not None and job.status is Status.FAILED and "deadline" in (job.last_error or "")


async def test_custom_pipeline_result_is_committed(store: LeaseStore) -> None:
    """A user pipeline without a persist stage still gets its last output committed, fenced."""
    seen = []

    async def compute(ctx: StageContext) -> dict[str, int]:
        for i in range(3):
            ctx.progress(i)
        return {"answer": 42}

    async def hook(ctx: StageContext, value: object) -> None:
        seen.append((ctx.fence.token, value))

    runner = Runner(
        store,
        pipeline=Pipeline([Stage("compute", compute)]),
        config=RunConfig(timings=FAST),
        hooks=RunHooks(persist_hook=hook),
    )
    record = await runner.run(Job("k"))
    assert record.output == {"answer": 42}
    assert seen == [(record.token, {"answer": 42})], "the hook gets the fence of the commit"
    runner2 = Runner(
        store,
        pipeline=Pipeline([Stage("compute", compute), Stage("persist", _persist)]),
        config=RunConfig(timings=FAST),
        hooks=RunHooks(persist_hook=hook),
    )
    record2 = await runner2.run(Job("k2"))
    assert seen[1:] == [(record2.token, {"answer": 42})]


async def _persist(ctx: StageContext) -> object:
    value = ctx.output("compute")
    await ctx.commit(value)
    return value


async def test_a_loop_blocked_after_the_grant_self_fences_before_the_model_call(
    store: LeaseStore,
) -> None:
    """The event loop is blocked 2.6 s right after a grant with TTL 3 s (self-fence margin
    0.5 s): the lease counts from the acquire's send time, so the owner self-fences instead
    of calling the model when another node could already hold the job."""
    import time

    timings = LeaseTimings(
        ttl=3.0, renew_interval=1.0, op_timeout=0.3, poll_interval=0.05, self_fence_margin=0.5
    )
    seen: list[str] = []

    def block_after_first_grant(event: object) -> None:
        kind = getattr(event, "kind", "")
        seen.append(kind)
        if kind == "acquired" and seen.count("acquired") == 1:
            # real: a real blocking call on the loop is what is tested
            time.sleep(2.6)  # on the loop, as a stuck sync call would

    provider = ScriptedProvider(["late answer"])
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(timings=timings),
        hooks=RunHooks(on_event=block_after_first_grant),
    )
    record = await runner.run(Job("k", input="x"))
    assert "self_fenced" in seen[: seen.index("acquired", 1)], seen
    assert provider.calls == 1 and record.attempts == 2 and record.output == "late answer"


async def test_cancelled_owners_hand_their_attempts_back(store: LeaseStore) -> None:
    """Three runs of one key cancelled mid-call (Ctrl-C) release the job without using up
    its attempts: it stays PENDING with 0 attempts, and a fourth run finishes it."""
    for _ in range(3):
        calling = asyncio.Event()

        def on_event(event: Event, calling: asyncio.Event = calling) -> None:
            if event.kind == "stage" and event.stage == "call_ai":
                calling.set()

        provider = ScriptedProvider(["x", Pause(30)])
        runner = Runner(
            store,
            provider=provider,
            config=RunConfig(timings=FAST),
            hooks=RunHooks(on_event=on_event),
        )
        run = asyncio.create_task(runner.run(Job("k", input="x")))
        await asyncio.wait_for(calling.wait(), 5)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        record = await store.get("k")
        assert record is not None and record.status is Status.PENDING, record
        assert record.attempts == 0, record
    done = await Runner(
        store, provider=ScriptedProvider(["fine"]), config=RunConfig(timings=FAST)
    ).run(Job("k", input="x"))
    assert done.output == "fine" and done.attempts == 1


async def test_the_job_deadline_starts_at_the_first_acquisition(store: LeaseStore) -> None:
    """A job that waited in the queue longer than its job deadline still runs: the deadline
    starts at the first acquisition (recorded as started_at), not at submission."""
    timings = dataclasses.replace(FAST, job_deadline=0.5)
    runner = Runner(store, provider=ScriptedProvider(["ran"]), config=RunConfig(timings=timings))
    submitted = await runner.submit(Job("k", input="x"))
    # real: a real store answers (SQLite from its thread, or a server)
    await asyncio.sleep(0.7)  # queued past the job deadline
    record = await runner.run(Job("k", input="x"))
    assert record.output == "ran" and record.started_at is not None
    assert record.started_at - submitted.created_at >= 0.6


async def test_the_queue_deadline_bounds_the_wait_for_a_first_acquisition(
    store: LeaseStore,
) -> None:
    """With lease.queue_deadline set (in Settings), a job that waited longer for its first
    acquisition ends FAILED, saying so, without calling the model; unset, there is no bound."""
    from ai_lease.settings import Settings

    assert Settings().lease_timings().queue_deadline == float("inf")
    settings = Settings(
        store={"op_timeout": 0.15, "poll_interval": 0.05},
        lease={"ttl": 1, "renew_interval": 0.2, "self_fence_margin": 0.2, "queue_deadline": 0.3},
    )
    timings = settings.lease_timings()
    provider = ScriptedProvider(["never"])
    runner = Runner(store, provider=provider, config=RunConfig(timings=timings))
    await runner.submit(Job("k", input="x"))
    # real: a real store answers (SQLite from its thread, or a server)
    await asyncio.sleep(0.5)
    with pytest.raises(JobFailed, match=r"in the queue, past its queue deadline of 0\.3s"):
        await runner.run(Job("k", input="x"))
    record = await store.get("k")
    assert record is not None and record.status is Status.FAILED and provider.calls == 0
    fresh = await runner.run(Job("k2", input="x"))  # run at once: no queue time at all
    assert fresh.status is Status.DONE


async def test_a_raising_event_sink_never_breaks_the_job(
    store: LeaseStore, caplog: pytest.LogCaptureFixture
) -> None:
    """An on_event that raises on every event: the job still ends DONE (not left RUNNING),
    the failures are counted and logged once."""

    def broken(event: Event) -> None:
        raise RuntimeError("dashboard down")

    runner = Runner(
        store,
        provider=ScriptedProvider(["fine"]),
        config=RunConfig(timings=FAST),
        hooks=RunHooks(on_event=broken),
    )
    record = await runner.run(Job("k", input="x"))
    stored = await store.get("k")
    assert record.output == "fine" and stored is not None and stored.status is Status.DONE
    assert runner.sink_failures > 3
    logged = [r for r in caplog.records if r.name == "ai_lease.runner"]
    assert len(logged) == 1 and logged[0].exc_info is not None


async def test_a_done_record_has_a_final_stage_and_no_growing_progress_age(
    store: LeaseStore,
) -> None:
    """After the commit the record's stage is "done" (not call_ai) and its progress age is
    not shown (it would only grow); a FAILED record keeps the stage it failed in."""
    await Runner(store, provider=ScriptedProvider(["fine"]), config=RunConfig(timings=FAST)).run(
        Job("k", input="x")
    )
    # real: a real store answers (SQLite from its thread, or a server)
    await asyncio.sleep(0.2)
    record = await store.get("k")
    assert record is not None and record.status is Status.DONE
    assert record.stage == "done" and record.since_progress is None
    with pytest.raises(JobFailed):
        await Runner(
            store,
            provider=Flaky(9, retryable=False),
            config=RunConfig(timings=FAST, call_retry=NO_CALL_RETRY),
        ).run(Job("k2", input="x"))
    failed = await store.get("k2")
    assert failed is not None and failed.stage != "done" and failed.since_progress is None


class _SubscribeLosesCancellation:
    """A redis-py PubSub whose subscribe is slow and loses the cancellation that ends it,
    then subscribes to a channel nobody publishes on: what redis-py 8.1 did under CPU load
    (a connect that swallowed the wait's timeout), with the notification lost as well."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pubsub, name)

    async def subscribe(self, *channels: str) -> None:
        try:
            # real: a slow subscribe beside a real redis-server connection
            await asyncio.sleep(1.0)
        except asyncio.CancelledError:
            pass  # lost
        await self._pubsub.subscribe("nobody-publishes-here")


async def test_a_follower_whose_notification_is_lost_returns_within_a_poll(
    redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower whose wake-up is lost (and whose wait's cancellation is swallowed by the
    Redis client) still re-reads the record every poll_interval: it returns the DONE result
    within one poll (+ slack) of the commit, never hangs."""
    from ai_lease.stores import open_store

    redis_server.flushall()
    owner_store = open_store(redis_server.url, op_timeout=0.5)
    follower_store = open_store(redis_server.url, op_timeout=0.5)
    client = follower_store._client  # type: ignore[attr-defined]
    real_pubsub = client.pubsub
    monkeypatch.setattr(client, "pubsub", lambda: _SubscribeLosesCancellation(real_pubsub()))
    committed_at: list[float] = []

    def on_event(event: Event) -> None:
        if event.kind == "committed":
            committed_at.append(asyncio.get_running_loop().time())

    try:
        owner = Runner(
            owner_store,
            provider=ScriptedProvider(["slow ", Pause(0.4), "answer"]),
            config=RunConfig(timings=FAST),
            hooks=RunHooks(on_event=on_event),
        )
        follower = Runner(
            follower_store, provider=ScriptedProvider(["never"]), config=RunConfig(timings=FAST)
        )
        owned = asyncio.create_task(owner.run(Job("k", input="x")))
        # real: a real store answers (SQLite from its thread, or a server)
        await asyncio.sleep(0.1)
        record = await asyncio.wait_for(follower.run(Job("k", input="x")), 5)
        returned_at = asyncio.get_running_loop().time()
        assert record.output == "slow answer" and (await owned).token == record.token
        assert returned_at - committed_at[0] <= FAST.poll_interval + 0.5
    finally:
        await owner_store.aclose()
        await follower_store.aclose()


async def test_three_ctrl_c_submits_leave_the_job_pending_not_failed(tmp_path: Any) -> None:
    """`ai-lease submit` interrupted with SIGINT (Ctrl-C) mid-stream, three times: the job
    is released each time, not failed — PENDING with 0 attempts — and a fourth submit
    finishes it."""
    import os
    import signal
    import subprocess
    import sys

    from ai_lease.stores import open_store
    from tests.harness.sse_server import Hang, SSEServer, chat_chunks, sse

    (tmp_path / "job.toml").write_text('key = "ctrl-c"\ninput = "One. Two."\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    store = open_store(f"sqlite:///{tmp_path / '.ai-lease' / 'ai-lease.db'}")
    async with SSEServer() as server:
        env |= {
            "AI_LEASE_PROVIDER__NAME": "openai-compatible",
            "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
            "AI_LEASE_PROVIDER__MODEL": "m",
        }
        for _ in range(3):
            server.enqueue(sse(*chat_chunks(["One "], finish_reason=None), Hang()))
        server.enqueue(sse(*chat_chunks(["One. Two."])))
        try:
            for _ in range(3):
                proc = await asyncio.create_subprocess_exec(
                    *[sys.executable, "-m", "ai_lease", "submit", "job.toml", "--quiet"],
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                await server.wait_connections_open(1, timeout_s=30)  # mid-stream now
                proc.send_signal(signal.SIGINT)
                _, err = await asyncio.wait_for(proc.communicate(), 30)
                assert proc.returncode != 0
                assert b"Traceback" not in err, err.decode()
                record = await store.get("ctrl-c")
                assert record is not None and record.status is Status.PENDING, record
                assert record.attempts == 0, record
                await server.wait_connections_open(0, timeout_s=10)
            proc = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "ai_lease", "submit", "job.toml", "--quiet"],
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            assert "One. Two." in out.decode()
        finally:
            await store.aclose()


async def test_a_sink_naming_its_kinds_gets_only_those_and_the_rest_are_not_built(
    store: LeaseStore,
) -> None:
    """A sink with ``kinds`` gets those kinds only; a kind no sink takes is never built
    (a sink without ``kinds`` still gets every kind)."""
    built: list[str] = []
    original = Event.__init__

    class Some:
        kinds = frozenset({"acquired", "stage_done"})

        def __init__(self) -> None:
            self.got: list[str] = []

        def __call__(self, event: Event) -> None:
            self.got.append(event.kind)

    def counting(self: Event, *args: Any, **kwargs: Any) -> None:
        built.append(args[0] if args else kwargs["kind"])
        original(self, *args, **kwargs)

    some = Some()
    config = RunConfig(timings=FAST, record_history=False, trace=False)
    runner = Runner(
        store, provider=ScriptedProvider(["fine"]), config=config, hooks=RunHooks(on_event=some)
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Event, "__init__", counting)
        await runner.run(Job("k", input="x"))
    assert set(some.got) == {"acquired", "stage_done"} and some.got.count("stage_done") == 5
    assert set(built) <= some.kinds
    everything: list[str] = []
    runner.hooks = RunHooks(on_event=lambda event: everything.append(event.kind))
    await runner.run(Job("k2", input="x"))
    assert {"acquired", "stage", "stage_done", "committed"} <= set(everything)
