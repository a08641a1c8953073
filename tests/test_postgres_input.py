"""What the PostgreSQL store does with input PostgreSQL itself would choke on: a key no job
can have (refused before any I/O), a long multibyte key (NOTIFY's payload is its digest), a
URL whose percent-encoding does not parse (the password never echoed), a result with a NUL
(an InputError, nothing written), a namespace holding ``%`` or longer than PostgreSQL's names."""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from ai_lease import ConfigError, InputError, JobSpecError, StoreUnavailable
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.stores import open_store
from ai_lease.stores.postgres import schema as postgres_schema
from ai_lease.stores.postgres.schema import channel_name
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer

REAL_TIME = "a socket to a real PostgreSQL server and its LISTEN/NOTIFY"


pytestmark = pytest.mark.postgres


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_in_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


@pytest.fixture
async def store(pg_server: PostgresServer, namespace: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=2.0)
    yield opened
    await opened.aclose()


def _schemas(pg: PostgresServer, namespace: str) -> int:
    rows = pg.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (namespace,))
    return int(rows[0][0])


# -- keys -------------------------------------------------------------------------------------


async def test_a_key_no_job_can_have_is_refused_before_any_io(
    store: PostgresStore, pg_server: PostgresServer, namespace: str
) -> None:
    """A 9000-character key (NOTIFY refuses it, the btree too): JobSpecError at once, from
    every operation taking a key, with a short message; nothing written, not even the
    schema."""
    key = "k" * 9000
    calls = [
        store.acquire(key, "A", ttl=5, max_no_progress=5),
        store.get(key),
        store.cancel(key),
        store.submit(key, "{}", "fp"),
        store.note(key, "reaped", "x", owner_id="A", token=1),
        store.retry(key),
        store.remove(key, force=True),
        store.reschedule(key, None),
        store.recover_at(key, 0.0),
        store.timeline(key),
        store.wait(key, 1),
    ]
    for call in calls:
        with pytest.raises(JobSpecError, match="9000 characters") as info:
            await call
        assert len(str(info.value)) < 200
    assert _schemas(pg_server, namespace) == 0


async def test_a_long_multibyte_key_works_end_to_end_and_wakes_its_follower(
    store: PostgresStore,
) -> None:
    """512 four-byte characters (2048 bytes: over the raw payload's limit, so NOTIFY carries
    its digest): acquire, a follower woken by the commit's NOTIFY, the record read back."""
    key = "\U0001f600" * 511 + "x"
    assert _payload(key).startswith("sha256:")
    won = await store.acquire(key, "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    await store.wait("warm-up", 0.2)  # the listener is up (its first connect wakes waiters)
    follower = asyncio.create_task(store.wait(key, 20))
    await asyncio.sleep(0.2)
    assert not follower.done()
    started = time.monotonic()
    await store.commit(won.fence, '"r"')
    await asyncio.wait_for(follower, 10)
    assert time.monotonic() - started < 3  # NOTIFY, not the 20 s timeout
    job = await store.get(key)
    assert job is not None and (job.key, job.status, job.result) == (key, Status.DONE, '"r"')


async def test_ail_notify_sends_a_digest_for_a_payload_notify_would_refuse(
    store: PostgresStore, pg_server: PostgresServer, namespace: str
) -> None:
    """The function itself never fails on a long key: 9000 bytes -> sha256:<hex>."""
    await store.get("warm-up")  # migrated
    channel = channel_name(namespace)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f'LISTEN "{channel}"')
        pg_server.execute(f'SELECT "{namespace}".ail_notify(%s)', ("x" * 9000,))
        heard = [n.payload for n in conn.notifies(timeout=5, stop_after=1)]
    assert heard == [_payload("x" * 9000)] and len(heard[0]) == 71


# -- URLs -------------------------------------------------------------------------------------

_SECRET = "s3cr%ZZet"


def _all_text(exc: BaseException) -> str:
    """Everything a log could print of ``exc``: its text, repr, causes and traceback."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts += [str(current), repr(current)]
        current = current.__cause__ or current.__context__
    parts += traceback.format_exception(exc)
    return "\n".join(parts)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{_SECRET}@h/db",
        f"postgres://u:pw@h/db?password={_SECRET}",
    ],
)
def test_a_url_that_does_not_parse_never_echoes_its_password(url: str) -> None:
    """libpq's parse message quotes the bad token (it may be the password): from_url and
    the constructor raise a fixed text with the masked URL, no cause or context."""
    for make in (lambda: open_store(url), lambda: PostgresStore(url)):
        with pytest.raises(ConfigError, match="does not parse") as info:
            make()
        assert _SECRET not in _all_text(info.value)
        assert info.value.__cause__ is None and info.value.__context__ is None


def _payload(key: str) -> str:
    make = getattr(postgres_schema, "notify_payload", lambda key: key)  # absent: the key
    return str(make(key))


# -- what is never sent twice ---------------------------------------------------------------


@pytest.fixture
def cut_after(pg_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The first statement naming a marker put in the returned list runs to its commit;
    then its backend is terminated from another session and the connection, read once
    more, breaks: an OperationalError on a broken connection after the write landed (a
    reply lost on the way back)."""
    markers: list[bytes] = []
    execute = psycopg.AsyncConnection.execute

    async def cut(self: psycopg.AsyncConnection[Any], query: Any, *args: Any, **kw: Any) -> Any:
        cursor = await execute(self, query, *args, **kw)
        hit = [m for m in markers if isinstance(query, bytes) and m in query]
        if hit:
            markers.remove(hit[0])
            pg_server.execute("SELECT pg_terminate_backend(%s)", (self.info.backend_pid,))
            await execute(self, "SELECT 1")  # raises: the server closed the connection
        return cursor

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", cut)
    yield markers


async def test_durations_are_not_counted_twice_when_the_reply_is_lost(
    store: PostgresStore, cut_after: list[bytes]
) -> None:
    """add_durations committed, its connection broke before the answer: StoreUnavailable
    (the caller keeps its counts), never a resend that would count them twice."""
    counts = {("p", "stage", "s1"): {3: 5}}
    await store.get("warm-up")
    cut_after.append(b"ail_add_durations")
    with pytest.raises(StoreUnavailable, match="add_durations"):
        await store.add_durations(counts)
    assert not cut_after  # the cut happened
    assert await store.load_durations() == {("p", "stage", "s1"): {3: 5}}


async def test_a_note_is_not_appended_twice_when_the_reply_is_lost(
    store: PostgresStore, cut_after: list[bytes]
) -> None:
    won = await store.acquire("noted", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    cut_after.append(b"ail_note_job")
    with pytest.raises(StoreUnavailable, match="note"):
        await store.note("noted", "terminated", "sent SIGTERM", owner_id="A", token=1)
    entries, _ = await store.timeline("noted")
    assert [e.kind for e in entries] == ["acquired", "terminated"]


async def test_a_commit_is_resent_when_the_reply_is_lost(
    store: PostgresStore, cut_after: list[bytes]
) -> None:
    """The same cut under a commit: resent on a fresh connection, the stored record back."""
    won = await store.acquire("resent", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    cut_after.append(b"ail_finish")
    job = await store.commit(won.fence, '"r"')
    assert not cut_after and (job.status, job.result) == (Status.DONE, '"r"')


# -- namespaces -------------------------------------------------------------------------------


async def test_a_namespace_with_a_percent_sign_works(pg_server: PostgresServer) -> None:
    """``ns%s``: psycopg reads the statement's text for placeholders; the name is not one."""
    namespace = f"ns%s_{uuid.uuid4().hex[:6]}"
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=2.0)
    try:
        await store.submit("job", "{}", "fp")
        assert await store.due(5) == ["job"]
        won = await store.acquire("job", "A", ttl=30, max_no_progress=30, fingerprint="fp")
        assert isinstance(won, Acquired)
        await store.wait("warm-up", 0.2)
        follower = asyncio.create_task(store.wait("job", 20))
        await asyncio.sleep(0.2)
        await store.commit(won.fence, '"r"')
        await asyncio.wait_for(follower, 10)
        job = await store.get("job")
        assert job is not None and job.status is Status.DONE
        assert [j.key for j in await store.list_jobs()] == ["job"]
    finally:
        await store.aclose()
        pg_server.reset(namespace)


def test_a_namespace_longer_than_a_postgresql_name_is_refused() -> None:
    """64 bytes would be cut to 63 by PostgreSQL (two namespaces, one schema): refused."""
    PostgresStore.from_url("postgresql://u@h/db", namespace="n" * 63)
    for namespace in ("n" * 64, "\u00e9" * 32):
        with pytest.raises(ConfigError, match=r"store\.namespace .*63 bytes"):
            PostgresStore.from_url("postgresql://u@h/db", namespace=namespace)


# -- input PostgreSQL refuses -----------------------------------------------------------------


async def test_a_nul_in_text_is_bad_input_and_changes_nothing(store: PostgresStore) -> None:
    """PostgreSQL's text holds no NUL: a result or spec with one is an InputError naming the
    op and the job (not a StoreUnavailable the caller would retry forever, nor an attempt
    the runner retries), sent to no server; the record stays as it was."""
    won = await store.acquire("nul", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    with pytest.raises(InputError, match="commit: the result of job 'nul' holds a NUL"):
        await store.commit(won.fence, '"a\x00b"')
    with pytest.raises(InputError, match="submit: the spec of job 'nul-spec' holds a NUL"):
        await store.submit("nul-spec", '{"x": "a\x00b"}', "fp")
    job = await store.get("nul")
    assert job is not None and (job.status, job.token) == (Status.RUNNING, won.fence.token)
    assert await store.get("nul-spec") is None


# -- closing --------------------------------------------------------------------------------


def _ours(pg: PostgresServer) -> int:
    rows = pg.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ai_lease'")
    return int(rows[0][0])


async def test_aclose_closes_a_pool_dropped_with_its_schema(
    pg_server: PostgresServer, namespace: str
) -> None:
    """The schema dropped under a warm store: the next call drops its pool; aclose() then
    leaves no connection of the store open."""
    baseline = _ours(pg_server)
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=2.0)
    try:
        await store.get("warm-up")
        await store.get("warm-up")
        pg_server.reset(namespace)
        with pytest.raises(StoreUnavailable):
            await store.get("gone")
    finally:
        await store.aclose()
    # real: a closed connection's backend leaves pg_stat_activity when its process exits,
    # after the client's close returns (seen lagging under load); a leak never leaves it
    for _ in range(100):  # up to 5 s
        if _ours(pg_server) == baseline:
            break
        await asyncio.sleep(0.05)
    assert _ours(pg_server) == baseline


# -- the listener -----------------------------------------------------------------------------


def _listeners(pg: PostgresServer) -> int:
    rows = pg.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'")
    return int(rows[0][0])


async def test_a_killed_listener_comes_back_and_wakes_a_follower_promptly(
    pg_server: PostgresServer, namespace: str
) -> None:
    """pg_terminate_backend on the LISTEN connection: the listener reconnects by itself,
    and a commit after that wakes a follower (reading and waiting, as follow.py does) in
    well under its poll_interval of 30 s."""
    store = PostgresStore.from_url(
        pg_server.url, namespace=namespace, op_timeout=2.0, poll_interval=30.0
    )
    try:
        won = await store.acquire("job", "A", ttl=60, max_no_progress=60)
        assert isinstance(won, Acquired)

        async def follow() -> None:
            while (job := await store.get("job")) is not None and job.status is Status.RUNNING:
                await store.wait("job", 30)

        follower = asyncio.create_task(follow())
        await _until(lambda: _listeners(pg_server) == 1)
        pg_server.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'"
        )
        await _until(lambda: _listeners(pg_server) == 0)
        await _until(lambda: _listeners(pg_server) == 1)  # back, by itself
        await asyncio.sleep(0.3)  # the follower is waiting on it again
        assert not follower.done()
        started = time.monotonic()
        await store.commit(won.fence, '"r"')
        await asyncio.wait_for(follower, 25)
        assert time.monotonic() - started < 5
    finally:
        await store.aclose()


async def _until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_frozen_server_under_a_quiet_listener_is_noticed(
    pg_server: PostgresServer, namespace: str
) -> None:
    """No NOTIFY comes and no TCP reset either (SIGSTOP): the listener's periodic check
    times out, and its waiters are woken to read (and poll) rather than sleep 30 s."""
    store = PostgresStore.from_url(
        pg_server.url, namespace=namespace, op_timeout=1.0, poll_interval=30.0
    )
    store._listener._check_every = 0.5  # the default is 10 s
    try:
        await store.wait("warm-up", 2)
        waiting = asyncio.create_task(store.wait("job", 30))
        await asyncio.sleep(0.2)
        pg_server.pause(for_s=12)
        try:
            started = time.monotonic()
            await asyncio.wait_for(waiting, 8)
            assert time.monotonic() - started < 5  # check (0.5 s) + its bound (1 s) + slack
        finally:
            pg_server.resume()
    finally:
        await store.aclose()


# -- races ------------------------------------------------------------------------------------


async def test_an_acquire_survives_a_remove_between_its_insert_and_its_lock(
    pg_server: PostgresServer, namespace: str
) -> None:
    """The record is made by another session while acquire's insert runs (a trigger slows
    the store's inserts) and removed while acquire waits for its lock: acquire tries again
    and makes the job (it used to read a NULL record as corrupt)."""
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=6.0)
    ns = f'"{namespace}"'
    try:
        await store.get("warm-up")  # migrated
        pg_server.execute(
            f"CREATE FUNCTION {ns}.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF current_setting('application_name') = 'ai_lease' THEN"
            " PERFORM pg_sleep(0.6); END IF; RETURN NEW; END $$"
        )
        pg_server.execute(
            f"CREATE TRIGGER slow BEFORE INSERT ON {ns}.ail_jobs"
            f" FOR EACH ROW EXECUTE FUNCTION {ns}.slow()"
        )
        acquiring = asyncio.create_task(store.acquire("race", "A", ttl=30, max_no_progress=30))
        await asyncio.sleep(0.2)  # acquire found nothing and sleeps in its insert
        pg_server.execute(
            f"INSERT INTO {ns}.ail_jobs (key, status, created_at, updated_at)"
            " VALUES ('race', 'PENDING', 0, 0)"
        )
        with psycopg.connect(pg_server.url) as locker:  # holds the row acquire will lock
            locker.execute(f"SELECT 1 FROM {ns}.ail_jobs WHERE key = 'race' FOR UPDATE")
            await asyncio.sleep(0.8)  # acquire's insert gave way and waits for the lock
            assert not acquiring.done()
            locker.execute(f"DELETE FROM {ns}.ail_jobs WHERE key = 'race'")
        won = await asyncio.wait_for(acquiring, 10)
        assert isinstance(won, Acquired) and won.job.status is Status.RUNNING
    finally:
        await store.aclose()
