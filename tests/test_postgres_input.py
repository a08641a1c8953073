"""What the PostgreSQL store does with input PostgreSQL itself would choke on: a key no job
can have (refused before any I/O), a long multibyte key (NOTIFY's payload is its digest), a
URL whose percent-encoding does not parse (the password never echoed), text with a NUL (a
ValueError, nothing written), a namespace holding ``%`` or longer than PostgreSQL's names."""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from ai_lease import ConfigError, JobSpecError
from ai_lease.job import Status
from ai_lease.lease import Acquired, open_store
from ai_lease.lease.postgres import PostgresStore
from ai_lease.lease import postgres_schema
from ai_lease.lease.postgres_schema import channel_name
from tests.harness.pg_server import PostgresServer

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
