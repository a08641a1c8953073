"""`ai-lease cancel KEY`: exit codes as the README states them."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from ai_lease.cli.app import main
from ai_lease.job import Status
from ai_lease.lease import Acquired
from ai_lease.stores.sqlite.store import SQLiteStore


async def _prepare(path: Path) -> None:
    async with SQLiteStore(path) as store:
        running = await store.acquire("running", "A", ttl=30, max_no_progress=30)
        assert isinstance(running, Acquired)
        done = await store.acquire("done", "A", ttl=30, max_no_progress=30)
        assert isinstance(done, Acquired)
        await store.commit(done.fence, '"the result"')


def test_cancel_exit_codes(tmp_path: Path) -> None:
    """cancel: 0 for a job it cancels (and again), 2 for a job already DONE (unchanged),
    2 for an unknown key; `result` of a cancelled job then exits 1."""
    asyncio.run(_prepare(tmp_path / "j.db"))
    url = ["--store", f"sqlite:///{tmp_path / 'j.db'}"]
    cli = CliRunner()
    first = cli.invoke(main, [*url, "cancel", "running", "--reason", "ops said so"])
    assert first.exit_code == 0 and "cancelled running" in first.output, first.output
    assert cli.invoke(main, [*url, "cancel", "running"]).exit_code == 0
    done = cli.invoke(main, [*url, "cancel", "done"])
    assert done.exit_code == 2 and "already ended DONE" in done.output, done.output
    unknown = cli.invoke(main, [*url, "cancel", "nope"])
    assert unknown.exit_code == 2 and "no job 'nope'" in unknown.output, unknown.output
    result = cli.invoke(main, [*url, "result", "running"])
    assert result.exit_code == 1 and "was cancelled (ops said so)" in result.output, result.output

    async def status() -> Status:
        async with SQLiteStore(tmp_path / "j.db") as store:
            job = await store.get("running")
            assert job is not None
            return job.status

    assert asyncio.run(status()) is Status.CANCELLED
