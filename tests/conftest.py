"""Shared fixtures: a real redis-server and a real PostgreSQL cluster per session (never
skipped), and a store per backend."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from ai_lease.lease import LeaseStore
from ai_lease.stores import open_store
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it: a run started in the background (``cmd &``, nohup,
    a CI runner that does so) inherits SIGINT ignored, and passes that on to every process
    it starts, where neither Python nor bash can undo it, so a test's Ctrl-C to the CLI
    would do nothing. Each test process (each xdist worker too) takes Python's own handler
    back, as if started from a terminal; it is what the children inherit that matters."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real redis-server for the session; a missing binary fails the run, never skips."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster of our own for the session (initdb + pg_ctl on a free port);
    a missing binary fails the run, never skips."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ai-lease.db'}"


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL per backend: a fresh SQLite file, a fresh Redis database, or a PostgreSQL
    database without any store schema (a leaked connection from the last test is cut first,
    so it cannot hold a lock the DROP waits for)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ai-lease.db'}"
    if request.param == "postgres":
        pg: PostgresServer = request.getfixturevalue("pg_server")
        pg.terminate_backends()
        pg.reset_all()
        return pg.url
    server: RedisServer = request.getfixturevalue("redis_server")
    server.flushall()
    return server.url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[LeaseStore]:
    store = open_store(store_url, op_timeout=2.0)
    yield store
    await store.aclose()


@pytest.fixture
async def slot_store(store_url: str) -> AsyncIterator[Any]:
    """The store of ``store_url``, its slot waiters polling often (SQLite has no push)."""
    store = open_store(store_url, op_timeout=2.0, poll_interval=0.05)
    yield store
    await store.aclose()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "ai-lease.db")
    yield store
    await store.aclose()


# The provider tests run once more under uvloop (the optional ``uvloop`` extra): a transport
# that is not an ``asyncio.Transport`` must not break an HTTP path (the hand-written one did).
_UVLOOP_FILES = frozenset(
    {"test_provider_http.py", "test_provider_wire.py", "test_stream_integrity.py"}
)


@pytest.hookimpl(optionalhook=True)
def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Any:
    """asyncio and uvloop for the provider tests; asyncio's own loop elsewhere."""
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if item.path.name not in _UVLOOP_FILES:
        return factories  # one factory: no extra test id
    try:
        import uvloop
    except ImportError:  # the floor-versions run has no extras
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Over pytest-xdist workers, what shares a costly server stays on one worker
    (tests/harness/xdist_groups.py); an explicit ``--dist`` other than load is kept."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from tests.harness.xdist_groups import GroupedScheduling  # xdist is a dev tool only

    return GroupedScheduling(config, log)
