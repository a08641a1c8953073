"""Text from outside is storable in every store (SQLite, Redis, PostgreSQL) by one rule
(lease/storable.py): diagnostics are stored with each NUL and lone surrogate written as its
visible escape, the same on every store; a result or spec is kept exactly or refused with
an InputError, never altered; a key, an owner id or a key prefix no job can have is refused
(or matches nothing) before any I/O."""

from __future__ import annotations

import pytest

from ai_lease.errors import InputError, JobSpecError
from ai_lease.job import RunFacts, Status, validate_key
from ai_lease.lease import LeaseStore
from ai_lease.lease.base import Acquired, Fence, JobListing
from ai_lease.lease.listing import encode_cursor
from ai_lease.lease.queue import JobQueue, WorkerInfo
from ai_lease.lease.storable import diagnostic, exact, key_can_start
from ai_lease.lease.timeline import JobNotes, JobTimeline

NUL, LONE = "bad \x00 request", "bad \ud800 request"
NUL_SAID, LONE_SAID = "bad \\u0000 request", "bad \\ud800 request"
OUTSIDE = pytest.mark.parametrize(("text", "said"), [(NUL, NUL_SAID), (LONE, LONE_SAID)])


async def _owned(store: LeaseStore, key: str) -> Fence:
    won = await store.acquire(key, "node#1.a", ttl=30, max_no_progress=30)
    assert isinstance(won, Acquired)
    return won.fence


async def _details(store: LeaseStore, key: str) -> str:
    assert isinstance(store, JobTimeline)
    entries, _ = await store.timeline(key)
    return " | ".join(f"{e.kind}: {e.detail} @{e.stage} by {e.owner_id}" for e in entries)


def test_a_diagnostic_is_escaped_visibly_and_clipped() -> None:
    """NUL -> ``\\u0000``, a lone surrogate -> ``\\ud800``, the rest untouched; clipped to
    the limit even after the escapes made it longer."""
    assert diagnostic(NUL) == NUL_SAID and diagnostic(LONE) == LONE_SAID
    assert diagnostic("plain \u00e9 text \U0001f600") == "plain \u00e9 text \U0001f600"
    assert diagnostic(None) is None
    assert diagnostic("\x00" * 100, limit=10) == "\\u0000\\u00"


def test_exact_text_is_returned_unchanged_or_refused() -> None:
    """A result is never altered: NUL kept where the store holds it, else InputError naming
    the job, the field and the offset; a lone surrogate is refused for every store."""
    assert exact("commit", "k", "result", NUL) == NUL
    with pytest.raises(InputError, match=r"commit: the result of job 'k' holds a NUL.*offset 4"):
        exact("commit", "k", "result", NUL, nul=False)
    with pytest.raises(InputError, match=r"lone surrogate \(U\+D800\).*offset 4"):
        exact("commit", "k", "result", LONE)


@pytest.mark.parametrize("key", ["a\x00b", "a\ud800b", "abc\n", "", "k" * 513])
def test_a_key_no_store_can_hold_is_refused(key: str) -> None:
    """validate_key refuses a NUL, a lone surrogate, a trailing newline (``$`` let it pass),
    an empty key and a long one; no key can start with such a prefix either."""
    with pytest.raises(JobSpecError, match="is invalid"):
        validate_key(key)
    assert not key_can_start(key)


@OUTSIDE
async def test_a_failure_reason_from_outside_ends_the_job_failed_with_it(
    store: LeaseStore, text: str, said: str
) -> None:
    """fail() with a provider's message holding a NUL or a lone surrogate: FAILED, the cause
    stored escaped (the same text on every store), in the record and the timeline."""
    fence = await _owned(store, "failed")
    job = await store.fail(fence, f"ProviderError: {text}")
    assert (job.status, job.last_error) == (Status.FAILED, f"ProviderError: {said}")
    again = await store.get("failed")
    assert again is not None and again.last_error == f"ProviderError: {said}"
    assert said in await _details(store, "failed")


@OUTSIDE
async def test_a_release_with_an_outside_error_hands_the_job_back_with_it(
    store: LeaseStore, text: str, said: str
) -> None:
    """release(error=…, snapshot=…) with such text: released (PENDING), both kept escaped;
    the next owner acquires at once rather than after the lease's TTL."""
    fence = await _owned(store, "released")
    assert await store.release(fence, error=text, snapshot=f"stack\n{text}")
    job = await store.get("released")
    assert job is not None and job.status is Status.PENDING
    assert job.last_error == said and job.stall_snapshot == f"stack\n{said}"
    assert isinstance(
        await store.acquire("released", "n2#1.b", ttl=30, max_no_progress=30), Acquired
    )


@OUTSIDE
async def test_a_finish_reason_from_outside_commits_the_whole_answer(
    store: LeaseStore, text: str, said: str
) -> None:
    """commit() with a finish reason, provider and model names holding such text: DONE, the
    result exactly as given, the finish reason and names escaped."""
    fence = await _owned(store, "done")
    facts = RunFacts(provider=f"p {text}", model=f"m {text}", stage_durations={"call_ai": 0.5})
    job = await store.commit(fence, '"the answer"', finish_reason=text, facts=facts)
    stored = await store.get("done")
    for record in (job, stored):
        assert record is not None and record.status is Status.DONE
        assert (record.result, record.finish_reason) == ('"the answer"', said)
        assert (record.provider, record.model) == (f"p {said}", f"m {said}")
    assert said in await _details(store, "done")


@OUTSIDE
async def test_stage_stall_cancel_and_note_text_from_outside_is_stored_escaped(
    store: LeaseStore, text: str, said: str
) -> None:
    """A renewal's stage, a stall snapshot, a cancel reason and a note (a request id from a
    provider) holding such text are written, escaped, never refused."""
    fence = await _owned(store, "noted")
    renewal = await store.renew(
        fence, ttl=30, stage=text, progress_version=1, max_no_progress=30, grace=1
    )
    assert renewal.ok
    assert await store.report_stall(fence, text, f"stuck at\n{text}")
    assert isinstance(store, JobNotes)
    assert await store.note("noted", "model_call", f"x-request-id={text}", owner_id=text, token=1)
    job = await store.cancel("noted", f"cancelled: {text}")
    assert job is not None and job.status is Status.CANCELLED
    assert (job.last_error, job.stage) == (f"cancelled: {said}", said)
    assert job.stall_snapshot == f"stuck at\n{said}"
    details = await _details(store, "noted")
    assert f"x-request-id={said}" in details and f"by {said}" in details


def _holds_nul(store_url: str) -> bool:
    return not store_url.startswith("postgres")


async def test_a_result_with_a_nul_is_kept_exactly_or_refused_never_altered(
    store: LeaseStore, store_url: str
) -> None:
    """A raw result with a NUL: SQLite and Redis keep it exactly; PostgreSQL refuses it with
    an InputError naming the job (not retryable), the record left RUNNING and unchanged."""
    fence = await _owned(store, "raw")
    if _holds_nul(store_url):
        job = await store.commit(fence, NUL)
        stored = await store.get("raw")
        assert job.result == NUL and stored is not None and stored.result == NUL
        return
    with pytest.raises(InputError, match="the result of job 'raw' holds a NUL"):
        await store.commit(fence, NUL)
    stored = await store.get("raw")
    assert stored is not None and (stored.status, stored.result) == (Status.RUNNING, None)


async def test_text_no_store_can_encode_is_refused_with_a_clear_error(
    store: LeaseStore,
) -> None:
    """A lone surrogate in a result, a spec or a checkpoint: InputError on every store
    (it was a TypeError or UnicodeEncodeError from deep inside), nothing written."""
    fence = await _owned(store, "lone")
    with pytest.raises(InputError, match="result of job 'lone' holds a lone surrogate"):
        await store.commit(fence, LONE)
    with pytest.raises(InputError, match="checkpoint of job 'lone' holds a lone surrogate"):
        await store.renew(
            fence,
            ttl=30,
            stage="call_ai",
            progress_version=1,
            max_no_progress=30,
            grace=1,
            checkpoint='{"text": "' + LONE + '"}',
        )
    assert isinstance(store, JobQueue)
    with pytest.raises(InputError, match="spec of job 'spec' holds a lone surrogate"):
        await store.submit("spec", '{"input": "' + LONE + '"}', "fp")
    assert await store.get("spec") is None
    stored = await store.get("lone")
    assert stored is not None and (stored.status, stored.progress_version) == (Status.RUNNING, 0)


@pytest.mark.parametrize("owner", ["n\x00#1.a", "n\ud800#1.a", ""])
async def test_an_owner_id_no_store_can_keep_exactly_is_refused(
    store: LeaseStore, owner: str
) -> None:
    """An owner id is part of the fence: never altered, refused before any write."""
    with pytest.raises(InputError, match="owner id"):
        await store.acquire("owned", owner, ttl=30, max_no_progress=30)
    assert await store.get("owned") is None


@pytest.mark.parametrize("key", ["a\x00b", "a\ud800b"])
async def test_a_key_no_store_can_hold_makes_no_job(store: LeaseStore, key: str) -> None:
    """acquire and submit with such a key: JobSpecError, no record (SQLite and Redis used to
    store a NUL key PostgreSQL cannot, and crash on a lone surrogate)."""
    with pytest.raises(JobSpecError, match="is invalid"):
        await store.acquire(key, "node#1.a", ttl=30, max_no_progress=30)
    assert isinstance(store, JobQueue)
    with pytest.raises(JobSpecError, match="is invalid"):
        await store.submit(key, "{}", "fp")
    assert await store.list_jobs() == []


@pytest.mark.parametrize("prefix", ["\x00", "a\x00", "\ud800", "a\n", "k" * 600])
async def test_a_prefix_no_key_can_start_lists_nothing(store: LeaseStore, prefix: str) -> None:
    """list_page(prefix=…) with a NUL, a lone surrogate, a control character or over 512
    characters: an empty last page on every store (PostgreSQL refused it, a surrogate
    crashed the others), with or without a status."""
    assert isinstance(store, JobQueue) and isinstance(store, JobListing)
    await store.submit("a-job", "{}", "fp")
    for status in (None, "PENDING"):
        page = await store.list_page(prefix=prefix, status=status)
        assert (page.jobs, page.next_cursor) == ([], None)
    page = await store.list_page(prefix="a-")
    assert [job.key for job in page.jobs] == ["a-job"]


async def test_a_cursor_naming_a_key_no_job_can_have_is_not_a_cursor(store: LeaseStore) -> None:
    """A cursor made up around a NUL key: the ValueError every made-up cursor gets."""
    assert isinstance(store, JobListing)
    with pytest.raises(ValueError, match="is not one a job page gave"):
        await store.list_page(after=encode_cursor(1, "a\x00b"))


@OUTSIDE
async def test_a_worker_beat_keeps_its_host_escaped_and_refuses_its_id(
    store: LeaseStore, text: str, said: str
) -> None:
    """A host name holding such text is kept escaped (PostgreSQL's jsonb refused even the
    JSON escape); a worker id holding it is the worker's identity: InputError, not listed."""
    assert isinstance(store, JobQueue)
    await store.worker_beat(WorkerInfo("w-1", text, 1, 0, 2, 0.0, 0.0), ttl=30)
    with pytest.raises(InputError, match="worker id"):
        await store.worker_beat(WorkerInfo(f"w {text}", "host", 1, 0, 2, 0.0, 0.0), ttl=30)
    assert [(w.worker_id, w.host) for w in await store.list_workers()] == [("w-1", said)]
