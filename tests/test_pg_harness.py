"""Tests of the PostgreSQL harness itself: our own cluster, killed, paused and restarted."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.harness import pg_server
from tests.harness.pg_server import PG_USER, PostgresServer, pg_binary

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    """A cluster of this module's own: these tests kill and pause it."""
    with PostgresServer() as running:
        yield running


@pytest.fixture
def up(server: PostgresServer) -> PostgresServer:
    """The module's cluster, running again whatever the last test did to it."""
    server.resume()
    if not server.running:
        server.start()
    return server


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def test_a_missing_binary_fails_loudly() -> None:
    """A tool found neither on PATH nor under /usr/lib/postgresql is an error naming apt-get."""
    with pytest.raises(RuntimeError, match="apt-get install postgresql"):
        pg_binary("no-such-postgres-tool")


def test_execute_answers_on_the_url(up: PostgresServer) -> None:
    """The URL reaches our cluster (trust auth, the test database) and execute() returns rows."""
    assert up.execute("SELECT current_database(), %s::int + 1", (41,)) == [("ailease_test", 42)]
    with psycopg.connect(up.url, connect_timeout=5) as conn:
        port = conn.execute("SELECT current_setting('port')").fetchone()
    assert port == (str(up.port),)
    assert up.execute("SHOW fsync") == [("off",)]


def test_the_server_runs_unprivileged(up: PostgresServer) -> None:
    """As root the postmaster runs as the unprivileged user, which owns the data directory."""
    if os.geteuid() == 0:
        expected = pwd.getpwnam(PG_USER).pw_uid
    else:
        expected = os.geteuid()
    assert _uid_of(up.pid) == expected
    assert up.data_dir.stat().st_uid == expected


def test_data_survives_a_kill_and_a_restart(up: PostgresServer) -> None:
    """SIGKILL is a crash, not a wipe: after crash recovery the committed row is there."""
    up.execute("CREATE TABLE IF NOT EXISTS kept (v int)")
    up.execute("INSERT INTO kept VALUES (7)")
    old_pid = up.pid
    up.kill()
    assert not up.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(up.url, connect_timeout=2)
    up.start()
    assert up.pid != old_pid
    assert (7,) in up.execute("SELECT v FROM kept")
    up.restart("fast")
    up.restart("immediate")
    assert (7,) in up.execute("SELECT v FROM kept")
    up.execute("DROP TABLE kept")


def test_pause_freezes_and_resume_thaws(up: PostgresServer) -> None:
    """While paused a connect gets no answer (it times out); after resume the same works."""
    up.pause()
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(up.url, connect_timeout=2)
    assert time.monotonic() - started >= 1.5  # real: a real PostgreSQL server process is paused
    up.resume()
    assert up.execute("SELECT 1") == [(1,)]


def test_a_timed_pause_ends_by_itself(up: PostgresServer) -> None:
    """pause(for_s=…) thaws without resume(): another process sends the SIGCONT."""
    up.pause(for_s=0.5)
    started = time.monotonic()
    assert up.execute("SELECT 1") == [(1,)]
    assert time.monotonic() - started >= 0.3  # real: a real PostgreSQL server process is paused
    up.resume()


def test_terminate_backends_cuts_other_connections(up: PostgresServer) -> None:
    """pg_terminate_backend hits the other session; its next statement fails."""
    with psycopg.connect(up.url, connect_timeout=5, autocommit=True) as victim:
        victim.execute("SELECT 1")
        assert up.terminate_backends() >= 1
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")


def test_reset_drops_the_namespace(up: PostgresServer) -> None:
    """reset() drops the store's schema with everything in it; reset_all() every schema."""
    up.execute("CREATE SCHEMA IF NOT EXISTS ai_lease")
    up.execute("CREATE TABLE ai_lease.t (v int)")
    up.execute("CREATE SCHEMA IF NOT EXISTS other_ns")
    up.reset()
    schemas = {row[0] for row in up.execute("SELECT nspname FROM pg_namespace")}
    assert "ai_lease" not in schemas and "other_ns" in schemas
    up.reset_all()
    schemas = {row[0] for row in up.execute("SELECT nspname FROM pg_namespace")}
    assert "other_ns" not in schemas and "public" in schemas


def test_close_removes_the_cluster() -> None:
    """close() kills the server and deletes its directory; a second close is harmless."""
    server = PostgresServer().start()
    data, pid = server.data_dir, server.pid
    server.close()
    server.close()
    assert not data.exists()
    assert not Path(f"/proc/{pid}").exists() or not pg_server._alive(pid)
