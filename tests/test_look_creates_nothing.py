"""A look never creates a store, on any backend: with no PostgreSQL schema a look says so
(exit 4) and leaves the database as it was; on Redis it writes no key; `ai-lease ui` with
no store is one line and exit 4 before it listens. A store opened with ``create=False``
raises :class:`StoreMissing` instead of making itself."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import Result

from ai_lease import open_store
from ai_lease.errors import StoreMissing
from ai_lease.redaction import mask_url
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer
from tests.test_cli_views import LOOKS as CLI_LOOKS
from tests.test_cli_views import cli as cli_views_cli

LOOKS = CLI_LOOKS  # the same twelve looks the CLI-view tests walk

# Every schema, relation and function outside the system schemas (and the schemas' names).
_OBJECTS = """
SELECT (SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace
          WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'),
       (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'),
       (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema')
"""


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AI_LEASE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def pg(pg_server: PostgresServer) -> PostgresServer:
    pg_server.terminate_backends()
    pg_server.reset_all()
    return pg_server


@pytest.fixture
def empty_redis(redis_server: RedisServer) -> RedisServer:
    redis_server.flushall()
    return redis_server


def cli(*args: str) -> Result:
    return cli_views_cli(*args)  # stderr kept apart on every click the package supports


def objects(pg: PostgresServer) -> tuple[Any, ...]:
    return pg.execute(_OBJECTS)[0]


def dbsize(server: RedisServer) -> int:
    client = redis.Redis.from_url(server.url)
    try:
        return int(client.dbsize())
    finally:
        client.close()


@pytest.mark.parametrize("look", LOOKS, ids=" ".join)
def test_a_look_at_postgres_without_the_schema_installs_nothing(
    pg: PostgresServer, look: Any
) -> None:
    """A look at a PostgreSQL database without the ai_lease schema exits 4 naming the masked
    URL, the namespace and what creates it, and no schema, table or function appears."""
    before = objects(pg)
    done = cli("--store", pg.url, *look)
    assert done.exit_code == 4, done.output
    line = done.stderr.strip()
    assert f"no ai_lease schema in {mask_url(pg.url)} (namespace 'ai_lease')" in line, line
    assert "`ai-lease submit`, `ai-lease worker` or `ai-lease migrate` creates it" in line
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert objects(pg) == before


def test_a_look_at_postgres_with_the_schema_answers(pg: PostgresServer) -> None:
    """Once a creating open made the schema, the same looks answer as before."""
    asyncio.run(_touch(pg.url))
    assert cli("--store", pg.url, "ls").exit_code == 0
    assert cli("--store", pg.url, "status", "nope").exit_code == 2


@pytest.mark.parametrize("look", LOOKS, ids=" ".join)
def test_a_look_at_an_empty_redis_writes_no_key(empty_redis: RedisServer, look: Any) -> None:
    """A look at an empty Redis database leaves it empty (no epoch or index marker key)."""
    done = cli("--store", empty_redis.url, *look)
    assert done.exit_code in (0, 2), done.output  # an unknown key is bad input; ls is empty
    assert dbsize(empty_redis) == 0


async def _touch(url: str, *, create: bool = True) -> None:
    store = open_store(url, create=create)
    try:
        await store.get("probe")
    finally:
        await store.aclose()


def test_open_store_create_false_raises_store_missing(pg: PostgresServer, tmp_path: Path) -> None:
    """``open_store(url, create=False)``: SQLite and PostgreSQL raise StoreMissing at the
    first operation and make nothing; a creating open still makes the store."""
    sqlite_url = f"sqlite:///{tmp_path / 'sub' / 'jobs.db'}"
    with pytest.raises(StoreMissing, match=r"no store at .*jobs\.db"):
        asyncio.run(_touch(sqlite_url, create=False))
    assert not (tmp_path / "sub").exists()
    before = objects(pg)
    with pytest.raises(StoreMissing, match="no ai_lease schema"):
        asyncio.run(_touch(pg.url, create=False))
    assert objects(pg) == before
    asyncio.run(_touch(pg.url))
    assert objects(pg) != before
    asyncio.run(_touch(pg.url, create=False))  # there now: a look reads it


def test_a_look_at_a_file_that_is_not_a_store_leaves_it_as_it_was(tmp_path: Path) -> None:
    """An existing SQLite file without the store's tables (empty, or another program's):
    a look raises StoreMissing naming it and writes nothing into it (no schema, no WAL)."""
    import sqlite3

    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE theirs (x)")
    conn.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    for file in (path, empty):
        before = file.read_bytes()
        with pytest.raises(StoreMissing, match="holds no ai_lease store"):
            asyncio.run(_touch(f"sqlite:///{file}", create=False))
        assert file.read_bytes() == before
        assert not Path(f"{file}-wal").exists()
    asyncio.run(_touch(f"sqlite:///{path}"))  # a creating open makes the store there
    asyncio.run(_touch(f"sqlite:///{path}", create=False))  # and a look then reads it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ui(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    port = str(_free_port())
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", "--store", url, "ui", "--port", port],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ui_without_a_store_is_one_line_and_exit_4(tmp_path: Path) -> None:
    """`ai-lease ui` where no SQLite store is: exit 4 with the one "no store at" line, no
    address printed (it never listened), and no file made."""
    done = _ui(f"sqlite:///{tmp_path / 'jobs.db'}", tmp_path)
    assert done.returncode == 4, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no store at" in lines[0], lines
    assert "`ai-lease submit` creates it" in lines[0]
    assert "http://" not in done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []


def test_ui_without_the_postgres_schema_is_exit_4(pg: PostgresServer, tmp_path: Path) -> None:
    """`ai-lease ui` on a database without the schema: exit 4, one line, nothing installed."""
    before = objects(pg)
    done = _ui(pg.url, tmp_path)
    assert done.returncode == 4, (done.returncode, done.stderr)
    assert "no ai_lease schema in" in done.stderr and "http://" not in done.stderr
    assert objects(pg) == before
