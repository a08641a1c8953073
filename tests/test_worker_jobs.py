"""A worker reports the keys of the jobs it runs, bounded; older entries without them load."""

from __future__ import annotations

import pytest

from ai_lease.errors import CorruptRecord
from ai_lease.lease.base import LeaseStore
from ai_lease.lease.queue import MAX_REPORTED_JOBS, JobQueue, WorkerInfo


def _info(jobs: tuple[str, ...]) -> WorkerInfo:
    return WorkerInfo("w-1", "host", 42, len(jobs), 8, 0.0, 1.0, jobs)


async def test_the_keys_a_worker_runs_come_back_from_the_store(store: LeaseStore) -> None:
    """Both stores keep the keys a heartbeat carries, in order."""
    assert isinstance(store, JobQueue)
    await store.worker_beat(_info(("report-1", "report-2")), ttl=30)
    (found,) = [w for w in await store.list_workers() if w.worker_id == "w-1"]
    assert found.jobs == ("report-1", "report-2") and found.running == 2


def test_an_entry_written_before_workers_reported_keys_loads() -> None:
    """No ``jobs`` field (an older worker): no keys, not corrupt."""
    blob = b'{"worker_id":"w","host":"h","pid":1,"running":0,"concurrency":2,'
    blob += b'"last_seen":1.0,"started_at":0.5}'
    assert WorkerInfo.from_json("w", blob).jobs == ()


def test_reported_keys_are_bounded_and_checked() -> None:
    """At most MAX_REPORTED_JOBS keys are read; a non-list or a non-string is corrupt."""
    many = ",".join(f'"k{i}"' for i in range(MAX_REPORTED_JOBS + 10))
    head = b'{"worker_id":"w","host":"h","pid":1,"running":0,"concurrency":2,'
    head += b'"last_seen":1.0,"started_at":0.5,"jobs":'
    assert len(WorkerInfo.from_json("w", head + f"[{many}]}}".encode()).jobs) == MAX_REPORTED_JOBS
    for bad in (b'"k1"}', b"[1, 2]}"):
        with pytest.raises(CorruptRecord, match="jobs"):
            WorkerInfo.from_json("w", head + bad)
