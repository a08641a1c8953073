"""PostgreSQL-specific behaviour: bad input (URLs, an unreachable server, credentials, a
schema we may not create, a foreign table of our name) as typed errors that name the URL
with its password masked and change nothing; ``ai-lease migrate``; one round trip per
operation; one listening connection per store; a resend after a killed connection."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from ai_lease import ConfigError, StoreUnavailable
from ai_lease.cli.app import main
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.refusal import RENEWAL_REFUSALS, WRITE_REFUSALS, Refusal
from ai_lease.stores import open_store
from ai_lease.stores.postgres import lease_sql as postgres_sql
from ai_lease.stores.postgres.schema import VERSION
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import free_port

REAL_TIME = "a socket to a real PostgreSQL server"


pytestmark = pytest.mark.postgres

SECRET = "hunter2-not-shown"


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_test_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


@pytest.fixture
async def store(pg_server: PostgresServer, namespace: str) -> AsyncIterator[PostgresStore]:
    opened = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=2.0)
    yield opened
    await opened.aclose()


def _url(pg: PostgresServer, user: str, password: str | None = None) -> str:
    auth = user if password is None else f"{user}:{password}"
    return f"postgresql://{auth}@{pg.host}:{pg.port}/{pg.database}"


def _schemas(pg: PostgresServer, namespace: str) -> int:
    rows = pg.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (namespace,))
    return int(rows[0][0])


@pytest.fixture
def role(pg_server: PostgresServer) -> Iterator[str]:
    """A login role with a password, which may not CREATE in the database (the default)."""
    name = f"ail_role_{uuid.uuid4().hex[:8]}"
    pg_server.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'right-password'")
    hba = pg_server.data_dir / "pg_hba.conf"
    before = hba.read_text()
    hba.write_text(f"host all {name} 127.0.0.1/32 scram-sha-256\n" + before)  # ours only
    pg_server.execute("SELECT pg_reload_conf()")
    time.sleep(0.2)
    yield name
    hba.write_text(before)
    pg_server.execute("SELECT pg_reload_conf()")
    pg_server.terminate_backends()
    pg_server.execute(f"DROP OWNED BY {name}")
    pg_server.execute(f"DROP ROLE {name}")


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}@db:notaport/jobs",
        f"postgres://app:{SECRET}@db/jobs?bogus_option=1",
        f"postgresql://app:{SECRET}@db/jobs?sslmode=sometimes",
    ],
)
async def test_a_bad_url_is_a_config_error_before_any_io(url: str) -> None:
    with pytest.raises(ConfigError, match=r"store\.url 'postgres(ql)?://app:\*\*\*@db") as info:
        store = open_store(url)
        await store.get("job")
    assert SECRET not in str(info.value)


async def test_an_unreachable_server_is_unavailable_naming_the_masked_url() -> None:
    url = f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/jobs"
    store = open_store(url, op_timeout=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(StoreUnavailable, match=r"postgresql://app:\*\*\*@127\.0\.0\.1") as info:
            await store.acquire("job", "A", ttl=5, max_no_progress=5)
    finally:
        await store.aclose()
    assert SECRET not in str(info.value) and "refused" in str(info.value)
    assert time.monotonic() - started < 5


async def test_wrong_credentials_are_a_config_error(pg_server: PostgresServer, role: str) -> None:
    for url in (_url(pg_server, role, SECRET), _url(pg_server, "no_such_role", SECRET)):
        store = open_store(url, namespace="ail_never_made")
        try:
            with pytest.raises(ConfigError, match=r"authentication failed|does not exist") as info:
                await store.get("job")
        finally:
            await store.aclose()
        assert SECRET not in str(info.value) and ":***@" in str(info.value)
    assert _schemas(pg_server, "ail_never_made") == 0


async def test_no_migration_and_no_right_to_create_it_changes_nothing(
    pg_server: PostgresServer, role: str, namespace: str
) -> None:
    """A user who may not CREATE meets a database without the schema: a ConfigError that
    says to run `ai-lease migrate`; after an admin did (and granted use), it works."""
    url = _url(pg_server, role, "right-password")
    store = PostgresStore.from_url(url, namespace=namespace)
    try:
        with pytest.raises(ConfigError, match="ai-lease migrate") as info:
            await store.acquire("job", "A", ttl=5, max_no_progress=5)
        assert "right-password" not in str(info.value) and f"{role}:***@" in str(info.value)
        assert _schemas(pg_server, namespace) == 0
        result = await _cli(pg_server.url, namespace)
        assert result.exit_code == 0 and f"applied migration {VERSION}" in result.output, (
            result.output
        )
        for grant in (
            f"GRANT USAGE ON SCHEMA {namespace} TO {role}",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {namespace} TO {role}",
            f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {namespace} TO {role}",
        ):
            pg_server.execute(grant)
        again = PostgresStore.from_url(url, namespace=namespace)
        try:
            won = await again.acquire("job", "A", ttl=5, max_no_progress=5)
            assert isinstance(won, Acquired)
        finally:
            await again.aclose()
    finally:
        await store.aclose()


async def test_a_foreign_table_of_our_name_is_refused_and_left_alone(
    pg_server: PostgresServer, namespace: str
) -> None:
    pg_server.execute(f"CREATE SCHEMA {namespace}")
    pg_server.execute(f"CREATE TABLE {namespace}.ail_jobs (theirs int)")
    pg_server.execute(f"INSERT INTO {namespace}.ail_jobs VALUES (7)")
    url = pg_server.url.replace("postgresql://ailease@", f"postgresql://ailease:{SECRET}@")
    store = PostgresStore.from_url(url, namespace=namespace)
    try:
        with pytest.raises(ConfigError, match="did not make") as info:
            await store.get("job")
    finally:
        await store.aclose()
    assert SECRET not in str(info.value)
    tables = pg_server.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (namespace,)
    )
    assert tables == [("ail_jobs",)]
    assert pg_server.execute(f"SELECT * FROM {namespace}.ail_jobs") == [(7,)]
    result = await _cli(url, namespace)
    assert result.exit_code == 2 and "did not make" in result.output and SECRET not in result.output


async def _cli(url: str, namespace: str) -> Any:
    """``ai-lease --store URL migrate`` (in a thread: the command runs its own event loop)."""
    env = {"AI_LEASE_STORE__NAMESPACE": namespace}
    return await asyncio.to_thread(CliRunner().invoke, main, ["--store", url, "migrate"], env=env)


def test_migrate_twice_says_up_to_date(pg_server: PostgresServer, namespace: str) -> None:
    cli, env = CliRunner(), {"AI_LEASE_STORE__NAMESPACE": namespace}
    first = cli.invoke(main, ["--store", pg_server.url, "migrate"], env=env)
    second = cli.invoke(main, ["--store", pg_server.url, "migrate"], env=env)
    assert first.exit_code == 0 and f"applied migration {VERSION}" in first.output, first.output
    assert second.exit_code == 0 and "up to date" in second.output


# -- the hot path -----------------------------------------------------------------------------


async def test_a_short_job_is_two_round_trips(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acquire + commit: two statements on the wire (once the store is warm)."""
    await store.get("warm-up")  # the first call checks the schema on a connection of its own
    sent: list[Any] = []
    execute = psycopg.AsyncConnection.execute

    async def counted(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(query)
        return await execute(self, query, *args, **kw)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted)
    won = await store.acquire("short", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    job = await store.commit(won.fence, '"answer"', finish_reason="stop")
    assert job.status is Status.DONE and job.result == '"answer"'
    assert len(sent) == 2, sent


async def test_many_followers_share_one_listening_connection(
    store: PostgresStore, pg_server: PostgresServer
) -> None:
    keys = [f"follow-{n}" for n in range(20)]
    fences = []
    for key in keys:
        won = await store.acquire(key, "owner", ttl=30, max_no_progress=30)
        assert isinstance(won, Acquired)
        fences.append(won.fence)
    await store.wait("warm-up", 2)  # the listener's first connect wakes every waiter once
    waits = [asyncio.create_task(store.wait(key, 10)) for key in keys]
    await asyncio.sleep(0.3)
    listening = pg_server.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'"
    )
    assert listening == [(1,)]
    started = time.monotonic()
    await store.commit(fences[3], '"r"')
    await asyncio.wait_for(waits[3], 2)
    assert time.monotonic() - started < 1.0
    assert not any(w.done() for n, w in enumerate(waits) if n != 3)
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)


async def test_a_killed_connection_is_resent_and_the_retry_is_idempotent(
    store: PostgresStore, pg_server: PostgresServer
) -> None:
    """pg_terminate_backend between calls: the next call goes out again on a fresh
    connection; a repeated acquire keeps its token, a repeated commit its record."""
    won = await store.acquire("killed", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    assert pg_server.terminate_backends() >= 1
    again = await store.acquire("killed", "A", ttl=30, max_no_progress=30)
    assert isinstance(again, Acquired) and again.fence == won.fence
    done = await store.commit(won.fence, '"r"')
    pg_server.terminate_backends()
    repeat = await store.commit(won.fence, '"r"')
    assert (repeat.status, repeat.result, repeat.finished_at) == (
        Status.DONE,
        '"r"',
        done.finished_at,
    )


def test_the_functions_answer_with_the_refusal_codes_of_their_kind() -> None:
    """ail_renew can answer every renewal refusal, ail_finish every write refusal (codes of
    the one enum, as the Lua scripts and the rules do)."""

    def codes(text: str) -> set[str]:
        return set(re.findall(r"'([a-z_]+)'", text)) & {r.value for r in Refusal}

    assert codes(postgres_sql._RENEW) == {r.value for r in RENEWAL_REFUSALS}
    assert codes(postgres_sql._FINISH) == {r.value for r in WRITE_REFUSALS}


async def test_a_note_is_appended_to_an_existing_job_only(store: PostgresStore) -> None:
    """note(): not fenced (an old owner's process), the store's clock, the detail clipped to
    2000 characters; an unknown key writes nothing; an unknown kind is refused before I/O."""
    won = await store.acquire("noted", "A", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    assert await store.note("noted", "terminated", "x" * 3000, owner_id="old", token=1)
    entries, _ = await store.timeline("noted")
    last = entries[-1]
    assert (last.kind, last.owner_id, last.token, last.seq) == ("terminated", "old", 1, 2)
    assert last.detail == "x" * 2000 and last.at >= entries[0].at
    assert not await store.note("no-such-job", "reaped", "gone", owner_id="A", token=1)
    assert await store.timeline("no-such-job") == ([], 0)
    with pytest.raises(ValueError, match="kind 'committed'"):
        await store.note("noted", "committed", "forged", owner_id="A", token=1)
