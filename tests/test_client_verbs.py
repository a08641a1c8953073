"""The Client verbs the CLI and the dashboard use: Client.open (a client that looks and
tidies, runs nothing), list, durations, migrate, remove with a reason, workers with
on_corrupt, connect(provider=None), and the same on SyncClient."""

from __future__ import annotations

from pathlib import Path

import pytest

import ai_lease
from ai_lease import ConfigError, Job, Status, connect
from ai_lease.client import Client
from ai_lease.errors import CorruptRecord, StoreMissing
from ai_lease.testing.scripted import ScriptedProvider


async def test_open_looks_and_tidies_but_runs_nothing(sqlite_url: str) -> None:
    async with connect(sqlite_url, provider=ScriptedProvider(["ok"])) as client:
        await client.run(Job("v-done", input="x"))
        await client.submit(Job("v-pending", input="x"))
    async with Client.open(sqlite_url, create=False) as look:
        assert look.provider is None
        assert [job.key for job in await look.list()] == ["v-pending", "v-done"]
        assert [job.key for job in await look.list(status=Status.DONE)] == ["v-done"]
        assert [job.key for job in await look.list(status="PENDING", limit=1)] == ["v-pending"]
        assert await look.counts() == {"DONE": 1, "PENDING": 1}
        cancelled = await look.cancel("v-pending", "tidied")
        assert cancelled is not None and cancelled.status is Status.CANCELLED
        retried = await look.retry("v-pending")
        assert retried is not None and retried.status is Status.PENDING
        removal = await look.remove("v-pending", force=True, reason="gone for good")
        assert removal.removed
        assert await look.status("v-pending") is None
        assert await look.prune(0.0) == 1
        assert await look.list() == []
        for refused in (look.run, look.submit):
            with pytest.raises(ConfigError, match="only looks and tidies"):
                await refused(Job("v-new", input="x"))
        with pytest.raises(ConfigError, match="only looks and tidies"):
            look.worker()
        with pytest.raises(ConfigError, match="only looks and tidies"):
            look.lease("v-new")
        assert look.timings == ai_lease.LeaseTimings()


async def test_open_without_create_never_makes_a_store(tmp_path: Path) -> None:
    db = tmp_path / "not-there.db"
    async with Client.open(f"sqlite:///{db}", create=False) as look:
        with pytest.raises(StoreMissing):
            await look.list()
    assert not db.exists()


async def test_remove_cancels_first_saying_the_reason(sqlite_url: str) -> None:
    async with connect(sqlite_url, provider=None) as client:
        await client.submit(Job("v-queued", input="x"))
        removal = await client.remove("v-queued", force=True, reason="removed by a script")
        assert removal.removed and removal.job is not None
        assert removal.job.last_error == "removed by a script"


async def test_connect_without_a_provider_records_jobs_for_workers(sqlite_url: str) -> None:
    async with connect(sqlite_url, provider=None) as client:
        assert client.provider is None
        record = await client.submit(Job("v-for-workers", input="x"))
        assert record.status is Status.PENDING
    async with connect(sqlite_url, provider=ScriptedProvider(["done"])) as client:
        async with client.worker(concurrency=1, sweep_interval=0.05):
            assert await client.result("v-for-workers", timeout=20) == "done"


async def test_a_client_tells_its_store_sides_losses_and_gauges(sqlite_url: str) -> None:
    from prometheus_client import CollectorRegistry

    from ai_lease.lease.admin import JobAdmin
    from ai_lease.lease.base import JobListing
    from ai_lease.lease.timeline import JobTimeline

    async with Client.open(sqlite_url) as look:
        assert look.serves(JobListing) and look.serves(JobTimeline) and look.serves(JobAdmin)
        assert not look.serves(int)
        assert await look.data_lost() is None  # a SQLite file does not lose data so
        registry = CollectorRegistry()
        collector = look.watch_gauges(registry)
        assert registry.get_sample_value("store_up") is not None  # read off the loop later
        registry.unregister(collector)
    with pytest.raises(RuntimeError, match="this client is closed"):
        look.serves(JobListing)


async def test_with_runner_runs_jobs_on_the_same_store_left_open(sqlite_url: str) -> None:
    async with Client.open(sqlite_url) as look:
        async with look.with_runner(provider=ScriptedProvider(["ran"])) as client:
            assert (await client.run(Job("v-runs", input="x"))).output == "ran"
        record = await look.status("v-runs")  # the store is still open: look closes it
        assert record is not None and record.status is Status.DONE


async def test_durations_read_what_runs_recorded(sqlite_url: str) -> None:
    async with connect(sqlite_url, provider=ScriptedProvider(["ok"])) as client:
        await client.run(Job("v-timed", input="x"))  # leaving the block saves the durations
    async with Client.open(sqlite_url, create=False) as look:
        skipped: list[CorruptRecord] = []
        durations = await look.durations(on_corrupt=skipped.append)
        assert durations and skipped == []
        assert all(isinstance(buckets, dict) and buckets for buckets in durations.values())
        assert await look.workers(on_corrupt=skipped.append) == []


async def test_migrate_is_for_postgres_only(sqlite_url: str) -> None:
    async with Client.open(sqlite_url) as look:
        with pytest.raises(ConfigError, match="needs no migration"):
            await look.migrate()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_migrate_installs_the_postgres_schema_once(store_url: str) -> None:
    from ai_lease.stores.postgres.schema import VERSION

    async with Client.open(store_url) as look:
        applied, version = await look.migrate()
        assert version == VERSION
        assert await look.migrate() == (False, VERSION)  # again: up to date
        assert applied or await look.counts() == {}


def test_the_sync_client_opens_looks_and_tidies(sqlite_url: str) -> None:
    from ai_lease.lease.timeline import JobTimeline

    with ai_lease.SyncClient.connect(sqlite_url, provider=ScriptedProvider(["ok"])) as client:
        client.run(Job("s-done", input="x"))
    with ai_lease.SyncClient.open(sqlite_url, create=False) as look:
        assert [job.key for job in look.list(status="DONE")] == ["s-done"]
        assert look.durations()
        assert look.workers(on_corrupt=print) == []
        assert look.serves(JobTimeline) and look.data_lost() is None
        with pytest.raises(ConfigError, match="needs no migration"):
            look.migrate()
        assert look.remove("s-done", reason="tidied").removed
        assert look.list() == []
