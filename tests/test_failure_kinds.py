"""Failures are codes: the one English table (ai_lease.failure), the exit code read
from the kind, a PostgreSQL schema at migration 1 upgraded to keep the kind, and no store
writing a failure sentence of its own."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis

from ai_lease.cli.exits import EXIT_FAILED, EXIT_TIMED_OUT, exit_code
from ai_lease.errors import (
    FirstTokenTimeout,
    InputError,
    JobDeadlineExceeded,
    JobFailed,
    ProviderError,
)
from ai_lease.failure import (
    MESSAGES,
    FailureKind,
    cause_kind,
    ended_by,
    kind_of,
    render,
    stored_error,
    timeline_detail,
)
from ai_lease.job import Job
from ai_lease.lease.base import Acquired, LeaseStore
from ai_lease.lease.timeline import TimelineEntry
from ai_lease.observe.metrics import Metrics
from ai_lease.retry import RetryPolicy
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.postgres.schema import VERSION
from ai_lease.stores.postgres.store import PostgresStore
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.testing.contract_support import own
from ai_lease.testing.scripted import Raise, ScriptedProvider
from tests.harness.pg_server import PostgresServer

PACKAGE = Path(__file__).resolve().parents[1] / "ai_lease"


def test_every_kind_has_its_words() -> None:
    """The table names every kind, and nothing else."""
    assert set(MESSAGES) == set(FailureKind)


def test_a_given_up_job_reads_as_the_sentence_and_back() -> None:
    """render and stored_error are inverses; other kinds keep their text as it is."""
    text = render(FailureKind.GAVE_UP, 3, "B crashed")
    assert text == "gave up after 3 attempts: B crashed"
    assert stored_error(FailureKind.GAVE_UP, 3, text) == "B crashed"
    assert render(FailureKind.GAVE_UP, 1, None) == "gave up after 1 attempts: lease lapsed"
    assert render(FailureKind.ERROR, 1, "x") == "x" and stored_error("error", 1, "x") == "x"


def test_the_timeline_detail_is_rendered_from_its_code() -> None:
    """A store writes gave_up:N; the entry readers get says it in words."""
    entry = TimelineEntry(1, 0.0, "failed", "A", 1, "", "gave_up:2")
    assert entry.detail == "gave up after 2 attempts"
    assert timeline_detail("renewed", "gave_up:2") == "gave_up:2"


def test_exceptions_map_to_kinds() -> None:
    assert kind_of(FirstTokenTimeout(0.3)) is FailureKind.TIMED_OUT
    assert kind_of(JobDeadlineExceeded("k", 1.0)) is FailureKind.TIMED_OUT
    assert kind_of(InputError("x")) is FailureKind.BAD_INPUT
    assert kind_of(ProviderError("401", retryable=False)) is FailureKind.PROVIDER_REFUSED
    assert kind_of(RuntimeError("x")) is FailureKind.ERROR
    assert cause_kind("StreamIdleTimeout: no chunk in 0.3s") is FailureKind.TIMED_OUT
    assert cause_kind("RuntimeError: x") is FailureKind.ERROR


def test_the_exit_code_reads_the_kind() -> None:
    """Exit 3 for a timed-out job (also one given up on after a timeout), 1 otherwise;
    the text does not decide it."""
    gave_up = render(FailureKind.GAVE_UP, 1, "FirstTokenTimeout: none in 0.3s")
    assert ended_by(FailureKind.GAVE_UP, 1, gave_up) == "timed_out"
    assert exit_code(JobFailed("k", gave_up, ended_by("gave_up", 1, gave_up))) == EXIT_TIMED_OUT
    assert exit_code(JobFailed("k", "FirstTokenTimeout: x", "timed_out")) == EXIT_TIMED_OUT
    assert exit_code(JobFailed("k", "FirstTokenTimeout: x", "error")) == EXIT_FAILED
    assert exit_code(JobFailed("k", "bad request", "provider_refused")) == EXIT_FAILED


def test_no_store_writes_a_failure_sentence() -> None:
    """The giving-up sentence exists in the one table only (Python, Lua and SQL alike;
    the contract suite's asserts on what readers see aside)."""
    found = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "gave up after" in path.read_text(encoding="utf-8")
        and path.relative_to(PACKAGE).parts[0] != "testing"
        and path.name != "failure.py"
    ]
    assert found == []


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_test_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


@pytest.mark.postgres
async def test_a_schema_at_migration_1_is_upgraded(
    pg_server: PostgresServer, namespace: str
) -> None:
    """A schema made by migration 1 (no failure_kind column) gets the column and the new
    functions on first use; its records stay readable (a FAILED one without a kind)."""
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=5.0)
    try:
        first = await store.acquire("old", "A", ttl=30, max_no_progress=30)
        assert isinstance(first, Acquired)
        await store.fail(first.fence, "it broke")
    finally:
        await store.aclose()
    # Back to what migration 1 left: no failure_kind column, version 1.
    pg_server.execute(f"ALTER TABLE {namespace}.ail_jobs DROP COLUMN failure_kind")
    pg_server.execute(f"UPDATE {namespace}.ail_migrations SET version = 1")
    pg_server.terminate_backends()
    store = PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=5.0)
    try:
        old = await store.get("old")
        assert old is not None and old.last_error == "it broke" and old.failure_kind is None
        taken = await store.acquire("new", "A", ttl=30, max_no_progress=30)
        assert isinstance(taken, Acquired)
        fence = taken.fence
        failed = await store.fail(fence, "no", kind=FailureKind.BAD_INPUT)
        assert failed.failure_kind == "bad_input"
    finally:
        await store.aclose()
    rows = pg_server.execute(f"SELECT max(version) FROM {namespace}.ail_migrations")
    assert rows == [(VERSION,)]


async def test_the_failed_jobs_counter_is_labelled_by_kind(sqlite_store: SQLiteStore) -> None:
    """A provider's refusal fails the job as provider_refused; a job whose one attempt timed
    out is given up on (gave_up) and still exits as timed out; both counted by kind."""
    metrics = Metrics()
    refused = ScriptedProvider([Raise(ProviderError("401 unauthorized", retryable=False))])
    runner = Runner(sqlite_store, provider=refused, hooks=RunHooks(on_event=metrics))
    with pytest.raises(JobFailed) as failed:
        await runner.run(Job("refused", input="x"))
    assert failed.value.kind == "provider_refused"
    job = await sqlite_store.get("refused")
    assert job is not None and job.failure_kind == "provider_refused"
    timeout = ScriptedProvider([Raise(FirstTokenTimeout(0.3))])
    config = RunConfig(retry=RetryPolicy(attempts=1))
    runner = Runner(sqlite_store, provider=timeout, config=config, hooks=RunHooks(on_event=metrics))
    with pytest.raises(JobFailed) as gave_up:
        await runner.run(Job("slow", input="x"))
    assert gave_up.value.kind == "timed_out" and exit_code(gave_up.value) == EXIT_TIMED_OUT
    assert (gave_up.value.reason or "").startswith("gave up after 1 attempts: FirstTokenTimeout")
    for kind in ("provider_refused", "gave_up"):
        labels = {"pipeline": "default", "kind": kind}
        assert metrics.registry.get_sample_value("job_failed_total", labels) == 1, kind


def test_ls_kind_lists_the_jobs_that_failed_that_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ai-lease ls --kind K` lists the FAILED jobs of kind K only; `status` names the kind."""
    from tests.test_cli_views import acquire, cli, on_store

    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AI_LEASE_")]:
        monkeypatch.delenv(name)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    for key, kind in (("refused", "provider_refused"), ("broken", "error")):
        fence = acquire(url, key)
        on_store(url, lambda store, f=fence, k=kind: store.fail(f, "no", kind=k))
    listed = cli("--store", url, "ls", "--json", "--kind", "provider_refused")
    assert listed.exit_code == 0, listed.output
    assert [orjson.loads(line)["key"] for line in listed.stdout.splitlines()] == ["refused"]
    shown = cli("--store", url, "status", "refused")
    assert "provider_refused" in shown.stdout


def _stored(store_url: str, request: pytest.FixtureRequest) -> tuple[object, object]:
    """The given-up job's stored last_error and failure_kind, read past the store."""
    if store_url.startswith("sqlite"):
        path = store_url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            blob = conn.execute("SELECT record FROM ai_lease_jobs").fetchone()[0]
        data = orjson.loads(blob)
        return data.get("last_error"), data.get("failure_kind")
    if store_url.startswith("redis"):
        client = redis.Redis.from_url(store_url, decode_responses=True)
        try:
            (name,) = [k for k in client.scan_iter("*") if client.type(k) == "hash" and
                       client.hget(k, "status") == "FAILED"]  # fmt: skip
            return client.hget(name, "last_error"), client.hget(name, "failure_kind")
        finally:
            client.close()
    pg: PostgresServer = request.getfixturevalue("pg_server")
    ((error, kind),) = pg.execute("SELECT last_error, failure_kind FROM ai_lease.ail_jobs")
    return error, kind


async def test_a_store_keeps_the_code_not_the_sentence(
    store: LeaseStore, store_url: str, request: pytest.FixtureRequest
) -> None:
    """Each store keeps a given-up job as gave_up and the last error as it was written."""
    fence = await own(store, "given-up", max_attempts=1)
    await store.release(fence, error="B crashed")
    await store.acquire("given-up", "B", ttl=5, max_no_progress=5, max_attempts=1)
    assert _stored(store_url, request) == ("B crashed", "gave_up")
    job = await store.get("given-up")
    assert job is not None and job.last_error == "gave up after 1 attempts: B crashed"
