"""The front door: connect(), Client, cancel, the sync facade and the lease context manager."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import ai_lease
from ai_lease import (
    FencingRejected,
    InputError,
    Job,
    JobCancelled,
    JobFailed,
    LeaseLost,
    LeaseTimings,
    RetryPolicy,
    SQLiteStore,
    Stalled,
    Status,
    connect,
)
from ai_lease.lease import Acquired, Following
from ai_lease.testing.scripted import Pause, ScriptedProvider
from tests.harness.redis_server import RedisServer

# Short leases so takeovers happen in a second: the first renewal at 0.2 s, the lease 1 s.
FAST = LeaseTimings(
    ttl=1.0, renew_interval=0.2, op_timeout=0.15, poll_interval=0.05, self_fence_margin=0.3
)


def slow_answer(words: int, pace: float = 0.05) -> ScriptedProvider:
    """A live model: one word every ``pace`` seconds (each one progress)."""
    script: list[str | Pause] = []
    for n in range(words):
        script += [Pause(pace), f"w{n} "]
    return ScriptedProvider(script)


# -- connect and close ----------------------------------------------------------------------------


async def test_connect_runs_a_job_and_closes_its_store_even_when_run_raises(
    sqlite_url: str,
) -> None:
    """The block closes the store connect() opened, also when run() raised inside it."""
    with pytest.raises(InputError):
        async with connect(sqlite_url) as client:
            record = await client.run(Job("k1", input="One sentence. Another one."))
            assert record.status is Status.DONE and record.output
            await client.run(Job("k2", input="text", prompt="no-such-prompt"))
    with pytest.raises(RuntimeError, match="shutdown"):  # its thread pool is gone: closed
        await client.store.get("k1")


async def test_connect_leaves_objects_it_was_given_open(tmp_path: Path) -> None:
    """A store and a provider passed in are the caller's: leaving the block closes neither."""
    provider = ScriptedProvider(["hello"])
    async with SQLiteStore(tmp_path / "j.db") as store:
        async with connect(store, provider=provider) as client:
            await client.run(Job("mine", input="x"))
        assert not provider.closed
        record = await store.get("mine")  # still open
        assert record is not None and record.output == "hello"


async def test_connect_takes_value_objects_and_refuses_options_for_an_object(
    sqlite_url: str,
) -> None:
    """Timings and retry policy reach the runner; provider_options beside an object is an
    InputError naming the mistake."""
    async with connect(sqlite_url, timings=FAST, retry=RetryPolicy(attempts=5)) as client:
        assert client.runner.timings is FAST and client.runner.retry.attempts == 5
    with pytest.raises(InputError, match="provider_options"):
        connect(sqlite_url, provider=ScriptedProvider([]), provider_options={"model": "m"})


async def test_connect_to_redis_runs_a_job(redis_server: RedisServer) -> None:
    """The same front door on a redis:// URL."""
    redis_server.flushall()
    async with connect(redis_server.url, provider=ScriptedProvider(["on redis"])) as client:
        record = await client.run(Job("r1", input="x"))
        assert record.output == "on redis"
        status = await client.status("r1")
        assert status is not None and status.status is Status.DONE


async def test_submit_then_a_worker_block_gives_the_result(sqlite_url: str) -> None:
    """submit() records a job; `async with client.worker()` runs it; result() waits for it."""
    async with connect(sqlite_url, provider=ScriptedProvider(["from a worker"])) as client:
        await client.submit(Job("queued", input="x"))
        pending = await client.status("queued")
        assert pending is not None and pending.status is Status.PENDING
        async with client.worker(concurrency=2, sweep_interval=0.05, grace=1.0):
            assert await client.result("queued", timeout=10) == "from a worker"
        with pytest.raises(InputError, match="no job"):
            await client.result("never-submitted")


# -- cancel ---------------------------------------------------------------------------------------


async def test_cancelled_pending_job_never_runs(sqlite_url: str) -> None:
    """A submitted job cancelled before any worker took it never calls the model."""
    provider = ScriptedProvider(["must not run"])
    async with connect(sqlite_url, provider=provider) as client:
        await client.submit(Job("p", input="x"))
        cancelled = await client.cancel("p", "changed my mind")
        assert cancelled is not None and cancelled.status is Status.CANCELLED
        async with client.worker(sweep_interval=0.05, grace=1.0):
            # real: a real store answers (SQLite from its thread, or a server)
            await asyncio.sleep(0.5)
        assert provider.calls == 0
        with pytest.raises(JobCancelled, match="changed my mind"):
            await client.result("p")
        with pytest.raises(JobCancelled):
            await client.run(Job("p", input="x"))


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_cancel_stops_a_running_owner_within_one_renew_interval(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A RUNNING job cancelled by key: its owner stops within one renew interval (and a
    bit), its result is never written, and a follower gets JobCancelled too."""
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.flushall()
        url = server.url
    else:
        url = f"sqlite:///{tmp_path / 'j.db'}"
    job = Job("long", input="x")
    async with (
        connect(url, provider=slow_answer(200), timings=FAST) as owner,
        connect(url, provider=ScriptedProvider(["never"]), timings=FAST) as follower,
    ):
        running = asyncio.create_task(owner.run(job))
        while (rec := await owner.status("long")) is None or rec.status is not Status.RUNNING:  # noqa: ASYNC110
            # real: a real store answers (SQLite from its thread, or a server)
            await asyncio.sleep(0.02)
        following = asyncio.create_task(follower.run(job))
        await asyncio.sleep(0.3)
        cancelled_at = time.monotonic()
        await owner.cancel("long")
        with pytest.raises(JobCancelled):
            await running
        stopped = time.monotonic() - cancelled_at
        with pytest.raises(JobCancelled):
            await following
    assert stopped < FAST.renew_interval + 1.0, f"owner took {stopped:.2f}s to stop"
    async with connect(url) as client:
        record = await client.status("long")
    assert record is not None and record.status is Status.CANCELLED and record.result is None


# -- the sync facade ------------------------------------------------------------------------------


def test_run_sync_from_plain_code(sqlite_url: str) -> None:
    """run_sync() runs a job from code with no event loop and returns its record."""
    record = ai_lease.run_sync(
        Job("s1", input="A sentence. Another."), store=sqlite_url, provider=ScriptedProvider(["ok"])
    )
    assert record.status is Status.DONE and record.output == "ok"


def test_sync_client_from_plain_code(sqlite_url: str) -> None:
    """SyncClient.connect() gives a blocking client: run, submit, status, cancel, result; its
    loop thread stops on close."""
    before = threading.active_count()
    with ai_lease.SyncClient.connect(sqlite_url, provider=ScriptedProvider(["sync"])) as client:
        assert client.run(Job("a", input="x")).output == "sync"
        assert client.result("a") == "sync"
        client.submit(Job("b", input="x"))
        status = client.status("b")
        assert status is not None and status.status is Status.PENDING
        cancelled = client.cancel("b")
        assert cancelled is not None and cancelled.status is Status.CANCELLED
        with pytest.raises(JobCancelled):
            client.result("b")
    assert threading.active_count() <= before


async def test_run_sync_inside_a_loop_says_what_to_use(sqlite_url: str) -> None:
    """run_sync() inside a running loop is refused with the async spelling to use."""
    with pytest.raises(RuntimeError, match=r"await client\.run"):
        ai_lease.run_sync(Job("x"), store=sqlite_url)


async def test_a_closed_client_says_so_and_cannot_be_entered_again(sqlite_url: str) -> None:
    """Like httpx: every method of a closed client raises "this client is closed" (never an
    executor's "cannot schedule new futures"), and ``async with`` on it again is refused."""
    client = connect(sqlite_url, provider=ScriptedProvider(["ok"]))
    async with client:
        assert (await client.run(Job("c1", input="x"))).output == "ok"
    calls = {
        "run": lambda: client.run(Job("c2", input="x")),
        "submit": lambda: client.submit(Job("c2", input="x")),
        "status": lambda: client.status("c1"),
        "result": lambda: client.result("c1"),
        "cancel": lambda: client.cancel("c1"),
        "retry": lambda: client.retry("c1"),
        "remove": lambda: client.remove("c1", force=True),
        "prune": lambda: client.prune(0),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="this client is closed"):
            await call()
        assert name  # each one refused
    with pytest.raises(RuntimeError, match="this client is closed"):
        client.worker()
    with pytest.raises(RuntimeError, match="this client is closed"):
        client.lease("c1")
    with pytest.raises(RuntimeError, match="cannot be entered again"):
        async with client:
            pass
    await client.aclose()  # closing twice is fine


def test_a_closed_sync_client_says_so(sqlite_url: str) -> None:
    """A closed SyncClient refuses each method with a clear error (and no coroutine left
    unawaited), refuses ``with`` again, and closes twice without complaint."""
    import warnings

    client = ai_lease.SyncClient.connect(sqlite_url, provider=ScriptedProvider(["ok"]))
    with client:
        assert client.run(Job("s1", input="x")).output == "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "never awaited" RuntimeWarning would fail here
        for call in (
            lambda: client.run(Job("s2", input="x")),
            lambda: client.status("s1"),
            lambda: client.result("s1"),
            lambda: client.cancel("s1"),
            lambda: client.prune(0),
        ):
            with pytest.raises(RuntimeError, match="this SyncClient is closed"):
                call()
    with pytest.raises(RuntimeError, match="cannot be entered again"), client:
        pass
    client.close()


async def test_a_sync_client_inside_a_running_loop_is_refused(sqlite_url: str) -> None:
    """A SyncClient would block the running loop it is called on: opening one there is
    refused, and so is calling one opened elsewhere, with the async spelling to use."""
    with pytest.raises(RuntimeError, match=r"running event loop.*await client\.run"):
        ai_lease.SyncClient.connect(sqlite_url)
    opened = await asyncio.to_thread(
        ai_lease.SyncClient.connect, sqlite_url, provider=ScriptedProvider(["ok"])
    )
    try:
        with pytest.raises(RuntimeError, match="a SyncClient method was called inside a running"):
            opened.status("k")
        assert await asyncio.to_thread(opened.status, "k") is None  # from a plain thread: fine
    finally:
        await asyncio.to_thread(opened.close)


def test_every_door_refuses_a_missing_store_with_one_error() -> None:
    """No store (None, or a thing that is not one) is the same TypeError at every door,
    naming the door, before anything is opened; a URL that names no store is ConfigError."""
    doors = {
        "connect()": lambda store: connect(store),
        "Runner()": lambda store: ai_lease.Runner(store),
        "open_store()": lambda store: ai_lease.open_store(store),
        "run_sync()": lambda store: ai_lease.run_sync(Job("k", input="x"), store),
        "SyncClient.connect()": lambda store: ai_lease.SyncClient.connect(store),
    }
    for name, door in doors.items():
        for missing in (None, 42):
            with pytest.raises(TypeError, match=r"store|URL") as caught:
                door(missing)
            assert "connect()" in str(caught.value) or name in str(caught.value), name
    with pytest.raises(TypeError, match=r"Worker\(\): store is None"):
        ai_lease.Worker(None, None)  # type: ignore[arg-type]
    with pytest.raises(ai_lease.ConfigError, match="unknown scheme"):
        connect("")


async def test_connect_takes_the_run_configuration_as_one_value(sqlite_url: str) -> None:
    """``config=RunConfig(…)`` reaches the runner whole (AdaptiveBudgets, a node id, call
    retries: fields connect() has no keyword for); ``timings=`` / ``retry=`` beside it is
    refused, saying to put them inside; anything but a RunConfig is a TypeError."""
    config = ai_lease.RunConfig(
        timings=FAST,
        retry=RetryPolicy(attempts=2),
        adaptive=ai_lease.AdaptiveBudgets(),
        node_id="api-7",
        call_retry=RetryPolicy(attempts=1),
    )
    async with connect(sqlite_url, provider=ScriptedProvider(["ok"]), config=config) as client:
        assert client.runner.config is config
        record = await client.run(Job("cfg", input="x"))
        assert record.output == "ok" and record.owner_id.startswith("api-7")
    with pytest.raises(InputError, match=r"timings given beside config=.*inside the RunConfig"):
        connect(sqlite_url, config=config, timings=FAST)
    with pytest.raises(InputError, match="timings and retry given beside config="):
        connect(sqlite_url, config=config, timings=FAST, retry=RetryPolicy(attempts=3))
    with pytest.raises(TypeError, match="not a RunConfig"):
        connect(sqlite_url, config={"timings": FAST})  # type: ignore[arg-type]


@pytest.mark.parametrize("store_url", ["sqlite", "redis", "postgres"], indirect=True)
async def test_a_script_can_look_as_the_cli_does(store_url: str) -> None:
    """jobs(), counts(), events() and workers() answer what `ai-lease ls`, `events` and
    `workers` show, on every store; the SyncClient has them too."""
    async with connect(store_url, provider=ScriptedProvider(["ok"]), timings=FAST) as client:
        await client.run(Job("look-1", input="x"))
        await client.submit(Job("look-2", input="x"))
        page = await client.jobs()
        assert [job.key for job in page.jobs] == ["look-2", "look-1"]
        pending = await client.jobs(status=Status.PENDING)
        assert [job.key for job in pending.jobs] == ["look-2"]
        assert [job.key for job in (await client.jobs(prefix="look-1")).jobs] == ["look-1"]
        assert await client.counts() == {"DONE": 1, "PENDING": 1}
        entries, dropped = await client.events("look-1")
        assert entries[0].kind == "acquired" and entries[-1].kind == "committed"
        assert dropped == 0
        assert await client.workers() == []
        async with client.worker(concurrency=1, worker_id="looker"):
            for _ in range(100):
                if [w.worker_id for w in await client.workers()] == ["looker"]:
                    break
                # real: a real store answers (SQLite from its thread, or a server)
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the worker never showed in client.workers()")


def test_the_sync_client_looks_too(sqlite_url: str) -> None:
    with ai_lease.SyncClient.connect(sqlite_url, provider=ScriptedProvider(["ok"])) as client:
        client.run(Job("s-look", input="x"))
        assert [job.key for job in client.jobs().jobs] == ["s-look"]
        assert client.counts() == {"DONE": 1}
        assert client.events("s-look")[0][-1].kind == "committed"
        assert client.workers() == []


# -- the lease context manager --------------------------------------------------------------------


async def test_lease_progress_keeps_it_past_the_ttl(sqlite_url: str) -> None:
    """A body that makes progress holds the lease well past one TTL; others follow; the
    commit is the job's result."""
    async with connect(sqlite_url, timings=FAST) as client:
        async with client.lease("own", stage="load", max_no_progress=0.5) as job:
            assert not job.done and job.token is not None
            started = time.monotonic()
            for n in range(30):  # 1.5 s of work, each step progress
                # real: a real store answers (SQLite from its thread, or a server)
                await asyncio.sleep(0.05)
                job.progress(n)
            assert time.monotonic() - started > FAST.ttl
            other = await client.store.acquire("own", "someone", ttl=1, max_no_progress=1)
            assert isinstance(other, Following)
            job.stage("call_ai", max_no_progress=90)
            await job.commit({"answer": 42})
            await asyncio.sleep(0.3)  # the keeper stopped with the commit: nothing cancels us
        assert await client.result("own") == {"answer": 42}
        async with client.lease("own") as again:  # DONE: the stored result, nothing held
            assert again.done and again.result == {"answer": 42} and again.token is None


async def test_lease_without_progress_lapses_and_another_owner_takes_over(
    sqlite_url: str,
) -> None:
    """No progress past the stage budget: the body is cancelled and the block raises
    Stalled; a waiting lease then owns the job with a higher token."""
    async with connect(sqlite_url, timings=FAST) as client:
        tokens: list[int] = []
        body_cancelled = []

        async def zombie() -> None:
            async with client.lease("z", stage="call_ai", max_no_progress=0.1) as job:
                tokens.append(job.token or 0)
                try:
                    # real: a real store answers (SQLite from its thread, or a server)
                    await asyncio.sleep(30)  # stuck: no progress
                except asyncio.CancelledError:
                    body_cancelled.append(True)
                    raise

        async def successor() -> None:
            # real: a real store answers (SQLite from its thread, or a server)
            await asyncio.sleep(0.1)
            async with client.lease("z") as job:
                tokens.append(job.token or 0)
                await job.commit("second owner")

        started = time.monotonic()
        results = await asyncio.gather(zombie(), successor(), return_exceptions=True)
        assert isinstance(results[0], Stalled), results
        assert results[1] is None, results
        assert body_cancelled and tokens[1] > tokens[0]
        assert time.monotonic() - started < 5
        assert await client.result("z") == "second owner"


async def test_stale_lease_commit_is_fencing_rejected(tmp_path: Path) -> None:
    """An owner whose lease lapsed on the store's clock while it thought it held it (the
    store clock jumped) cannot commit over the new owner: FencingRejected."""
    now = [1_000.0]
    store = SQLiteStore(tmp_path / "j.db", clock=lambda: now[0])
    timings = LeaseTimings(ttl=30, renew_interval=5, op_timeout=1, self_fence_margin=2)
    async with store, connect(store, timings=timings) as client:
        with pytest.raises(FencingRejected) as rejected:
            async with client.lease("stale") as job:
                now[0] += 31  # the lease lapsed by the store's clock
                newer = await store.acquire("stale", "B", ttl=30, max_no_progress=30)
                assert isinstance(newer, Acquired) and newer.fence.token > (job.token or 0)
                await job.commit("zombie's answer")
        assert rejected.value.current == newer.fence
        await store.commit(newer.fence, '"the real answer"')
        assert await client.result("stale") == "the real answer"


async def test_leaving_a_lease_without_commit_releases_it(sqlite_url: str) -> None:
    """Leaving the block without a commit steps down: the next owner gets it at once."""
    async with connect(sqlite_url, timings=FAST) as client:
        async with client.lease("free") as job:
            first = job.token
        record = await client.status("free")
        assert record is not None and record.status is Status.PENDING
        outcome = await client.store.acquire("free", "next", ttl=1, max_no_progress=1)
        assert isinstance(outcome, Acquired) and outcome.fence.token > (first or 0)


async def test_an_error_in_the_body_follows_the_retry_policy(sqlite_url: str) -> None:
    """A retryable error releases with the error (counted) and goes on; bad input fails the
    job and raises JobFailed from it."""
    async with connect(sqlite_url, timings=FAST, retry=RetryPolicy(attempts=3)) as client:
        with pytest.raises(OSError, match="disk on fire"):
            async with client.lease("flaky"):
                raise OSError("disk on fire")
        record = await client.status("flaky")
        assert record is not None and record.status is Status.PENDING
        assert record.attempts == 1 and "disk on fire" in (record.last_error or "")
        with pytest.raises(JobFailed, match="not a CSV") as failed:  # as a runner's attempt
            async with client.lease("bad"):
                raise InputError("the input is not a CSV file")
        assert isinstance(failed.value.__cause__, InputError)
        with pytest.raises(JobFailed, match="not a CSV"):
            async with client.lease("bad"):
                pass


async def test_a_cancelled_lease_cancels_the_body(sqlite_url: str) -> None:
    """cancel(key) while a lease is held: the body is cancelled within one renew interval
    and the block raises LeaseLost; a later lease raises JobCancelled."""
    async with connect(sqlite_url, timings=FAST) as client:
        seen: list[BaseException] = []

        async def body() -> None:
            async with client.lease("c", max_no_progress=5) as job:
                try:
                    for n in range(1000):  # 20 s of live work, unless cancelled
                        # real: a real store answers (SQLite from its thread, or a server)
                        await asyncio.sleep(0.02)
                        job.progress(n)
                except asyncio.CancelledError as exc:
                    seen.append(exc)
                    raise

        task = asyncio.create_task(body())
        # real: a real store answers (SQLite from its thread, or a server)
        await asyncio.sleep(0.1)
        cancelled_at = time.monotonic()
        await client.cancel("c")
        with pytest.raises(LeaseLost, match="not_running"):
            await asyncio.wait_for(task, 10)
        assert seen, "the body was not cancelled"
        assert time.monotonic() - cancelled_at < FAST.renew_interval + 1.0
        with pytest.raises(JobCancelled):
            async with client.lease("c"):
                pass


async def test_a_lease_cancelled_from_outside_steps_down(sqlite_url: str) -> None:
    """A shutdown (the task cancelled from outside) propagates CancelledError and hands
    the lease back at once, the attempt uncounted."""
    async with connect(sqlite_url, timings=FAST) as client:
        entered = asyncio.Event()

        async def body() -> None:
            async with client.lease("shutdown"):
                entered.set()
                # real: a real store answers (SQLite from its thread, or a server)
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        record = await client.status("shutdown")
        assert record is not None and record.status is Status.PENDING and record.attempts == 0


# -- async context managers -----------------------------------------------------------------------


async def test_stores_and_providers_close_on_leaving_the_block(tmp_path: Path) -> None:
    """`async with` a store or a provider closes it, also when the body raised."""
    from ai_lease.providers.local import LocalExtractiveProvider
    from ai_lease.resource import AsyncResource

    with pytest.raises(ValueError):
        async with SQLiteStore(tmp_path / "j.db") as store:
            await store.get("x")
            raise ValueError("body failed")
    with pytest.raises(RuntimeError, match="shutdown"):
        await store.get("x")
    async with LocalExtractiveProvider() as provider:
        assert isinstance(provider, AsyncResource)


async def test_a_worker_block_stops_the_worker_and_waits_for_it(sqlite_url: str) -> None:
    """Leaving `async with client.worker()` stops the worker: it has left the store's list
    of live workers before the block returns."""
    async with connect(sqlite_url) as client:
        async with client.worker(sweep_interval=0.05, grace=1.0) as worker:
            while not await client.store.list_workers():  # noqa: ASYNC110
                # real: a real store answers (SQLite from its thread, or a server)
                await asyncio.sleep(0.02)
        assert await client.store.list_workers() == []
        assert worker._task is None
