"""One bad stored value never breaks a whole command: `ls`, `workers`, `tune`, `result` and an
adaptive `submit` report corrupt data with its key (exit 4 where it is shown), never a
traceback, and keep serving everything else. Corrupt data is planted directly with sqlite3 /
redis-py, on SQLite and on a real redis-server."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import sqlite3
from pathlib import Path

import orjson
import redis
from click.testing import CliRunner

from ai_lease import Acquired, open_store
from ai_lease.cli.app import main
from ai_lease.lease.histogram import bucket_of
from ai_lease.lease.queue import WorkerInfo

NS = "ai_lease"


@dataclasses.dataclass(frozen=True)
class CliOut:
    """What a CLI run printed: stdout and stderr apart, and both (``output``)."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> CliOut:
    """Run the CLI in-process; any exception but SystemExit (a traceback) fails the test."""
    # click < 8.2 mixes stderr into stdout unless told not to (8.2 always keeps them apart).
    apart = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}
    result = CliRunner(**apart).invoke(main, ["--store", url, *args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"traceback instead of an error line: {result.exception!r}")
    out = CliOut(result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in out.output
    return out


def seed(url: str) -> None:
    """Two good jobs (one DONE), one live worker and a well-sampled duration series."""

    async def work() -> None:
        store = open_store(url)
        try:
            done = await store.acquire("good-done", "node-a", ttl=30, max_no_progress=5)
            assert isinstance(done, Acquired)
            await store.commit(done.fence, '"the summary"')
            await store.acquire("good-running", "node-a", ttl=30, max_no_progress=5)
            info = WorkerInfo("good-worker", "host", 1, 0, 4, 0.0, 0.0)
            await store.worker_beat(info, 30)  # type: ignore[attr-defined]
            series = ("default", "stage", "load")
            await store.add_durations({series: {bucket_of(0.5): 50}})  # type: ignore[attr-defined]
        finally:
            await store.aclose()

    asyncio.run(work())


def sqlite_db(url: str) -> sqlite3.Connection:
    return sqlite3.connect(url.removeprefix("sqlite:///"))


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def pg_execute(url: str, query: str, params: tuple[object, ...] = ()) -> None:
    """One statement in the store's schema (PostgreSQL: the tables are typed, so what is
    corrupt there is a value no ai_lease writes)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path = {NS}")
        conn.execute(query.encode(), params)


def plant_corrupt_job(url: str) -> None:
    """A job record that is no ai_lease record (garbage on SQLite, a string key on Redis)."""
    if url.startswith("sqlite"):
        with sqlite_db(url) as conn:
            conn.execute(
                "INSERT INTO ai_lease_jobs (key, status, lease_expires_at, record)"
                " VALUES ('bad-job', 'DONE', NULL, 'garbage')"
            )
    elif url.startswith("postgres"):
        pg_execute(
            url,
            "INSERT INTO ail_jobs (key, status, created_at, updated_at)"
            " VALUES ('bad-job', 'garbage', 1, 1)",
        )
    else:
        redis_client(url).set(f"{NS}:{{bad-job}}:job", "garbage")


def plant_corrupt_result(url: str, key: str) -> None:
    """A DONE record whose stored result is not the JSON document results are kept as."""
    if url.startswith("sqlite"):
        with sqlite_db(url) as conn:
            (blob,) = conn.execute(
                "SELECT record FROM ai_lease_jobs WHERE key = ?", (key,)
            ).fetchone()
            record = orjson.loads(blob) | {"result": "{not json"}
            conn.execute(
                "UPDATE ai_lease_jobs SET record = ? WHERE key = ?", (orjson.dumps(record), key)
            )
    elif url.startswith("postgres"):
        pg_execute(url, "UPDATE ail_jobs SET result = '{not json' WHERE key = %s", (key,))
    else:
        redis_client(url).hset(f"{NS}:{{{key}}}:job", "result", "{not json")


def plant_corrupt_worker(url: str) -> None:
    """A worker entry that is not JSON, and one with a field of the wrong type."""
    bad_type = orjson.dumps(
        {"worker_id": "typed-worker", "host": "h", "pid": 1, "running": 0, "concurrency": 4}
        | {"last_seen": "yesterday", "started_at": 0.0}
    )
    if url.startswith("sqlite"):
        with sqlite_db(url) as conn:
            conn.execute("INSERT INTO ai_lease_workers VALUES ('bad-worker', 1e18, 'garbage')")
            conn.execute(
                "INSERT INTO ai_lease_workers VALUES ('typed-worker', 1e18, ?)", (bad_type,)
            )
    elif url.startswith("postgres"):
        pg_execute(url, "INSERT INTO ail_workers VALUES ('bad-worker', 1e18, 'garbage')")
        pg_execute(url, "INSERT INTO ail_workers VALUES ('typed-worker', 1e18, %s)", (bad_type,))
    else:
        client = redis_client(url)
        client.zadd(f"{NS}:workers", {"bad-worker": 1e12, "typed-worker": 1e12})
        client.set(f"{{{NS}:workers}}:worker:bad-worker", "garbage")
        client.set(f"{{{NS}:workers}}:worker:typed-worker", bad_type)


def plant_corrupt_histogram(url: str) -> None:
    """A foreign member in the duration index and a bucket that is not a number."""
    if url.startswith("sqlite"):
        with sqlite_db(url) as conn:
            conn.execute(
                "INSERT INTO ai_lease_durations VALUES ('default', 'stage', 'parse', 'x', 'y')"
            )
    elif url.startswith("postgres"):  # a bucket and a count add_durations never writes
        pg_execute(url, "INSERT INTO ail_durations VALUES ('default', 'stage', 'parse', -1, -5)")
    else:
        client = redis_client(url)
        client.sadd(f"{NS}:hists", "not-a-series")
        name = orjson.dumps(["default", "stage", "parse"]).decode()
        client.sadd(f"{NS}:hists", name)
        client.hset(f"{NS}:hist:{name}", "x", "y")


# -- the commands -------------------------------------------------------------------------


def test_ls_lists_the_rest_and_marks_the_corrupt_record(store_url: str) -> None:
    """ls with one corrupt record: every good job listed, the bad one marked with its key,
    exit 4 (store corrupt) after the full listing."""
    seed(store_url)
    plant_corrupt_job(store_url)
    out = cli(store_url, "ls")
    assert out.exit_code == 4, out.output
    assert "good-done" in out.stdout and "good-running" in out.stdout
    [bad] = [line for line in out.stdout.splitlines() if "bad-job" in line]
    assert "CORRUPT" in bad
    as_json = cli(store_url, "ls", "--json")
    rows = [orjson.loads(line) for line in as_json.stdout.splitlines()]
    assert {r["key"] for r in rows} == {"good-done", "good-running", "bad-job"}
    assert next(r for r in rows if r["key"] == "bad-job")["corrupt"]


def test_ls_status_filter_still_works_beside_a_corrupt_record(store_url: str) -> None:
    """A corrupt record does not stop a filtered listing either."""
    seed(store_url)
    plant_corrupt_job(store_url)
    out = cli(store_url, "ls", "--status", "done")
    assert "good-done" in out.stdout and "good-running" not in out.stdout


def test_status_of_a_corrupt_record_is_one_line_exit_4(store_url: str) -> None:
    """status of the corrupt key itself: one line naming the key, exit 4."""
    seed(store_url)
    plant_corrupt_job(store_url)
    out = cli(store_url, "status", "bad-job")
    assert out.exit_code == 4 and "'bad-job'" in out.output


def test_result_with_a_corrupt_stored_result_is_one_line_exit_4(store_url: str) -> None:
    """result of a DONE job whose stored result is not JSON: exit 4 naming the key."""
    seed(store_url)
    plant_corrupt_result(store_url, "good-done")
    out = cli(store_url, "result", "good-done")
    assert out.exit_code == 4, out.output
    assert "'good-done'" in out.output and "result" in out.output


def test_workers_lists_the_rest_and_marks_corrupt_entries(store_url: str) -> None:
    """workers with a non-JSON entry and a mistyped one: the live worker listed, both bad
    entries marked with their ids, exit 4."""
    seed(store_url)
    plant_corrupt_worker(store_url)
    out = cli(store_url, "workers")
    assert out.exit_code == 4, out.output
    assert "good-worker" in out.stdout
    for bad in ("bad-worker", "typed-worker"):
        [line] = [line for line in out.stdout.splitlines() if bad in line]
        assert "CORRUPT" in line


def test_tune_suggests_from_the_rest_and_reports_the_bad_series(store_url: str) -> None:
    """tune with a corrupt histogram: the good series still suggested, the bad one named."""
    seed(store_url)
    plant_corrupt_histogram(store_url)
    out = cli(store_url, "tune", "--min-samples", "10")
    assert out.exit_code == 4, out.output
    [load] = [line for line in out.stdout.splitlines() if " load " in line]
    assert "too few samples" not in load
    assert "corrupt" in out.stderr.lower()


def test_adaptive_submit_runs_beside_a_corrupt_histogram(store_url: str, tmp_path: Path) -> None:
    """In adaptive mode a corrupt histogram member is skipped and reported; the job runs."""
    seed(store_url)
    plant_corrupt_histogram(store_url)
    job = tmp_path / "job.toml"
    job.write_text('key = "adaptive-1"\nprompt = "summarize"\ninput = "One. Two. Three."\n')
    env = {"AI_LEASE_ADAPTIVE__ENABLED": "true", "AI_LEASE_ADAPTIVE__MIN_SAMPLES": "10"}
    out = cli(store_url, "submit", str(job), env=env)
    assert out.exit_code == 0, out.output
    assert "corrupt" in out.stderr.lower()
    assert cli(store_url, "result", "adaptive-1").exit_code == 0
