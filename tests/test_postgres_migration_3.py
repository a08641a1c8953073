"""The PostgreSQL timeline numbered from the timeline itself (migration 3): a schema at
migration 2 (a heads table numbering the entries, the helper functions) is upgraded in place
with its entries kept and numbered on from the last one; notes written at once by many
callers on one job still get one number each, in order, none twice. And the one-statement
paths of acquire (a submitted job nobody held) and commit (the fence that holds), judged
like any record when they do not apply."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.stores.postgres.schema import VERSION
from ai_lease.stores.postgres.store import PostgresStore
from tests.harness.pg_server import PostgresServer

pytestmark = pytest.mark.postgres

# What migration 2 had and migration 3 drops: the numbering table, and a helper function the
# lease functions called (the upgrade drops every ail_ function and makes its own again).
_V2_LEFTOVERS = """
CREATE TABLE {ns}.ail_timeline_heads (key text COLLATE "C" PRIMARY KEY, next_seq int NOT NULL,
  dropped int NOT NULL);
INSERT INTO {ns}.ail_timeline_heads
  SELECT key, max(seq) + 1, 0 FROM {ns}.ail_timeline GROUP BY key;
CREATE FUNCTION {ns}.ail_note(p_key text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
UPDATE {ns}.ail_migrations SET version = 2;
"""


@pytest.fixture
def namespace(pg_server: PostgresServer) -> Iterator[str]:
    name = f"ail_tl_{uuid.uuid4().hex[:10]}"
    yield name
    pg_server.terminate_backends()
    pg_server.reset(name)


def _store(pg_server: PostgresServer, namespace: str) -> PostgresStore:
    return PostgresStore.from_url(pg_server.url, namespace=namespace, op_timeout=5.0)


async def _own(store: PostgresStore, key: str, owner: str = "A") -> Acquired:
    got = await store.acquire(key, owner, ttl=30, max_no_progress=30)
    assert isinstance(got, Acquired)
    return got


async def test_a_schema_at_migration_2_is_upgraded_with_its_timelines(
    pg_server: PostgresServer, namespace: str
) -> None:
    """Entries written before the upgrade stay as they were; the next entry of the same job
    is numbered after its last one; the heads table and the old helper functions are gone."""
    store = _store(pg_server, namespace)
    try:
        old = await _own(store, "old")
        for version in (1, 2):
            renewal = await store.renew(
                old.fence, ttl=30, stage="call_ai", progress_version=version,
                max_no_progress=30, grace=5,
            )  # fmt: skip
            assert renewal.ok
    finally:
        await store.aclose()
    for statement in _V2_LEFTOVERS.format(ns=namespace).strip().split(";\n"):
        pg_server.execute(statement)
    pg_server.terminate_backends()
    store = _store(pg_server, namespace)
    try:
        await store.commit(old.fence, "answer", finish_reason="stop")
        await _own(store, "new")
        entries, dropped = await store.timeline("old")
        assert dropped == 0
        assert [(e.seq, e.kind) for e in entries] == [
            (1, "acquired"), (2, "renewed"), (3, "renewed"), (4, "committed"),
        ]  # fmt: skip
        fresh, _ = await store.timeline("new")
        assert [(e.seq, e.kind) for e in fresh] == [(1, "acquired")]
    finally:
        await store.aclose()
    assert pg_server.execute(f"SELECT max(version) FROM {namespace}.ail_migrations") == [(VERSION,)]
    left = pg_server.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = 'ail_timeline_heads'"
        " UNION ALL SELECT p.proname FROM pg_proc p JOIN pg_namespace n"
        " ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = 'ail_note'",
        (namespace, namespace),
    )
    assert left == []


async def test_notes_written_at_once_get_one_number_each(
    pg_server: PostgresServer, namespace: str
) -> None:
    """Many notes and renewals of one job sent at once (several connections): the entries
    are numbered 1..n with no gap and no number twice, every note kept."""
    store = _store(pg_server, namespace)
    try:
        fence = (await _own(store, "busy")).fence
        notes = [
            store.note("busy", "model_call", f"call {i}", owner_id="A", token=fence.token)
            for i in range(40)
        ]
        renewals = [
            store.renew(
                fence, ttl=30, stage="call_ai", progress_version=i, max_no_progress=30, grace=5
            )
            for i in range(1, 11)
        ]
        done = await asyncio.gather(*notes, *renewals)
        assert all(done[:40]) and all(r.ok for r in done[40:])
        entries, dropped = await store.timeline("busy")
        assert dropped == 0
        assert [e.seq for e in entries] == list(range(1, 52))
        details = {e.detail for e in entries if e.kind == "model_call"}
        assert details == {f"call {i}" for i in range(40)}
    finally:
        await store.aclose()


async def test_a_submitted_job_is_granted_once_and_judged_like_any_record(
    pg_server: PostgresServer, namespace: str
) -> None:
    """A job submitted and never held is granted in one statement: racing acquirers get one
    owner; another fingerprint conflicts and no attempt left gives up, as for any record;
    the grant's timeline entry carries the token it issued."""
    store = _store(pg_server, namespace)
    try:
        for key in ("raced", "other-fp", "no-attempts"):
            await store.submit(key, '{"input": "x"}', "fp-1")
        outcomes = await asyncio.gather(
            *(
                store.acquire(
                    "raced", f"node-{i}#1", ttl=30, max_no_progress=30, fingerprint="fp-1"
                )
                for i in range(12)
            )
        )
        owners = [o for o in outcomes if isinstance(o, Acquired)]
        assert len(owners) == 1 and owners[0].fence.token > 0
        assert all(type(o).__name__ == "Following" for o in outcomes if o is not owners[0])
        entries, _ = await store.timeline("raced")
        assert [(e.kind, e.token, e.detail) for e in entries] == [
            ("acquired", owners[0].fence.token, "attempt 1")
        ]
        with pytest.raises(JobConflict):
            await store.acquire("other-fp", "A", ttl=30, max_no_progress=30, fingerprint="fp-2")
        gave_up = await store.acquire(
            "no-attempts", "A", ttl=30, max_no_progress=30, max_attempts=0
        )
        assert type(gave_up).__name__ == "Finished" and gave_up.job.status is Status.FAILED
    finally:
        await store.aclose()


async def test_a_commit_after_a_takeover_is_rejected_and_its_owners_repeat_answered(
    pg_server: PostgresServer, namespace: str
) -> None:
    """The one-statement commit writes only under the fence that holds: the old owner's
    late commit is rejected (naming the new fence), the new owner's commit lands, and its
    repeat answers with the stored record."""
    store = _store(pg_server, namespace)
    try:
        old = await store.acquire("k", "node-a#1", ttl=0.2, max_no_progress=30)
        assert isinstance(old, Acquired)
        await asyncio.sleep(0.35)  # real: the lease lapses on the server's clock
        new = await store.acquire("k", "node-b#1", ttl=30, max_no_progress=30)
        assert isinstance(new, Acquired) and new.takeover
        with pytest.raises(FencingRejected) as rejected:
            await store.commit(old.fence, "late")
        assert rejected.value.current == new.fence
        done = await store.commit(new.fence, "answer")
        again = await store.commit(new.fence, "answer")
        assert done.status is Status.DONE and again.result == done.result == "answer"
        entries, _ = await store.timeline("k")
        assert [e.kind for e in entries] == [
            "acquired", "taken_over", "fenced_write_rejected", "committed"
        ]  # fmt: skip
    finally:
        await store.aclose()
