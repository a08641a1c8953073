"""What the looking commands print is honest: `status --json` and `ls --json` are one object
per job, `config` parses and round-trips, a look never creates a store, figures read from
a record say how old they are, and `status --watch` ends with the documented exit codes."""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from click.testing import CliRunner, Result

from ai_lease import Acquired, open_store
from ai_lease.cli.app import main
from ai_lease.lease import LeaseStore
from ai_lease.lease.fence import Fence

T = TypeVar("T")


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    # click < 8.2 mixes stderr into stdout unless told not to (8.2 always keeps them apart).
    apart = {"mix_stderr": False} if "mix_stderr" in inspect.signature(CliRunner).parameters else {}
    return CliRunner(**apart).invoke(main, list(args), env=env, catch_exceptions=False)


def on_store(url: str, work: Callable[[LeaseStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = open_store(url)
        try:
            return await work(store)
        finally:
            await store.aclose()

    return asyncio.run(run())


def acquire(url: str, key: str, owner: str = "node-a") -> Fence:
    async def work(store: LeaseStore) -> Fence:
        won = await store.acquire(key, owner, ttl=30, max_no_progress=5)
        assert isinstance(won, Acquired)
        return won.fence

    return on_store(url, work)


def done(url: str, key: str, result: Any) -> None:
    fence = acquire(url, key)
    on_store(url, lambda store: store.commit(fence, orjson.dumps(result).decode()))


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("AI_LEASE_")]:
        monkeypatch.delenv(name)
    return f"sqlite:///{tmp_path / 'jobs.db'}"


# -- 1. status --json and ls --json: one object per job -----------------------------------------


def test_status_json_and_ls_json_are_the_same_object(url: str) -> None:
    """status --json carries health and the result decoded once, with exactly the keys
    ls --json gives the same job (one function builds both)."""
    done(url, "done-job", {"answer": 42})
    acquire(url, "running-job")
    listed = cli("--store", url, "ls", "--json")
    assert listed.exit_code == 0, listed.output
    by_key = {row["key"]: row for row in map(orjson.loads, listed.stdout.splitlines())}
    for key in ("done-job", "running-job"):
        shown = cli("--store", url, "status", key, "--json")
        assert shown.exit_code == 0, shown.output
        one = orjson.loads(shown.stdout)
        assert set(one) == set(by_key[key]), set(one) ^ set(by_key[key])
        assert one["health"] == by_key[key]["health"]
    assert by_key["done-job"]["result"] == {"answer": 42}
    status_done = orjson.loads(cli("--store", url, "status", "done-job", "--json").stdout)
    assert status_done["result"] == {"answer": 42}  # decoded once, not a string of JSON
    status_running = orjson.loads(cli("--store", url, "status", "running-job", "--json").stdout)
    assert status_running["health"] == "healthy"


def test_status_json_shows_the_stored_spec_as_an_object(url: str, tmp_path: Path) -> None:
    """A submitted job's stored spec is a JSON object in status --json and ls --json, not a
    string holding JSON."""
    (tmp_path / "job.toml").write_text('key = "spec-job"\ninput = "One. Two. Three."\n')
    submitted = cli("--store", url, "submit", str(tmp_path / "job.toml"), "--detach")
    assert submitted.exit_code == 0, submitted.output
    shown = orjson.loads(cli("--store", url, "status", "spec-job", "--json").stdout)
    listed = orjson.loads(cli("--store", url, "ls", "--json").stdout.splitlines()[0])
    assert isinstance(shown["spec"], dict) and shown["spec"]["input"] == "One. Two. Three."
    assert shown["spec"] == listed["spec"]


# -- 2. config: it parses, and what it prints is accepted back -----------------------------------


@pytest.mark.parametrize("store", ["sqlite:///.ai-lease/ai-lease.db", "sqlite:///{tmp}/abs.db"])
def test_config_store_url_round_trips_through_store(url: str, tmp_path: Path, store: str) -> None:
    """The store URL `config` prints (the default relative one, and an absolute
    sqlite:////path) names the same store when fed back with --store."""
    store = store.format(tmp=tmp_path)
    done(store, "job-1", "ok")
    shown = cli("config", env={"AI_LEASE_STORE__URL": store})
    assert shown.exit_code == 0, shown.output
    printed = orjson.loads(shown.stdout)["store"]["url"]
    assert printed == store
    listed = cli("--store", printed, "ls", "--json")
    assert listed.exit_code == 0, listed.output
    assert [orjson.loads(line)["key"] for line in listed.stdout.splitlines()] == ["job-1"]


def test_config_with_masked_secrets_is_valid_json(url: str) -> None:
    """With an API key, a ?password= in a base URL and a Redis password set, the output
    is valid JSON: every masked secret is a JSON string holding ***, none leaks, and an
    unset secret is still null (not a bare ***)."""
    secret = "hunter2-CANARY"
    env = {
        "AI_LEASE_PROVIDER__BASE_URL": f"http://llm.internal/v1?password={secret}&region=eu",
        "AI_LEASE_STORE__URL": f"redis://:{secret}@cache:6379/0",
    }
    unset = cli("config", env=env)
    assert unset.exit_code == 0, unset.output
    assert orjson.loads(unset.stdout)["provider"]["api_key"] is None
    env["AI_LEASE_PROVIDER__API_KEY"] = "sk-" + secret
    shown = cli("config", env=env)
    assert shown.exit_code == 0, shown.output
    assert secret not in shown.stdout
    settings = orjson.loads(shown.stdout)
    provider = settings["provider"]
    assert provider["base_url"] == "http://llm.internal/v1?password=***&region=eu"
    assert isinstance(provider["api_key"], str) and "***" in provider["api_key"]
    assert settings["store"]["url"] == "redis://:***@cache:6379/0"


# -- 3. a look never creates a store -------------------------------------------------------------

LOOKS = [
    ("status", "foo"),
    ("status", "foo", "--json"),
    ("status", "foo", "--watch"),
    ("ls",),
    ("result", "foo"),
    ("events", "foo"),
    ("workers",),
    ("tune",),
    ("cancel", "foo"),
    ("retry", "foo"),
    ("rm", "foo"),
    ("prune", "--older-than", "1d"),
]


@pytest.mark.parametrize("look", LOOKS, ids=" ".join)
def test_a_look_in_a_fresh_directory_creates_no_store(url: str, tmp_path: Path, look: Any) -> None:
    """In a fresh directory a command that only looks (or acts on a key that cannot exist)
    creates nothing: neither the default ./.ai-lease/ai-lease.db nor a --store file; it
    says there is no store and that submit creates one, exit 4."""
    default = cli(*look)
    assert default.exit_code == 4, default.output
    assert "no store at" in default.stderr and "`ai-lease submit` creates it" in default.stderr
    assert str(tmp_path / ".ai-lease" / "ai-lease.db") in default.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())
    named = cli("--store", url, *look)
    assert named.exit_code == 4 and "no store at" in named.stderr, named.output
    assert list(tmp_path.iterdir()) == []


def test_a_look_at_an_existing_store_still_works(url: str) -> None:
    """Once submit (here: a store operation) has made the store, the same looks answer."""
    done(url, "job-1", "ok")
    assert cli("--store", url, "ls").exit_code == 0
    assert cli("--store", url, "status", "nope").exit_code == 2  # no job: bad input, as before


# -- 6. ls says how many it did not show; status --watch ends with the job's exit code -----------


def test_ls_says_how_many_of_how_many(url: str) -> None:
    """ls showing fewer jobs than match says "N of M" on stderr (stdout stays rows), with
    a status filter and with a health filter; nothing when all are shown."""
    for key in ("a", "b", "c"):
        acquire(url, key)
    done(url, "d", "ok")
    cut = cli("--store", url, "ls", "--limit", "2")
    assert cut.exit_code == 0, cut.output
    assert len(cut.stdout.splitlines()) == 3  # header + 2 rows
    assert "2 of 4 jobs shown" in cut.stderr
    running = cli("--store", url, "ls", "--status", "RUNNING", "--limit", "1", "--json")
    assert len(running.stdout.splitlines()) == 1 and "1 of 3 jobs shown" in running.stderr
    healthy = cli("--store", url, "ls", "--health", "healthy", "--limit", "2")
    assert "2 of 3 jobs shown" in healthy.stderr
    whole = cli("--store", url, "ls")
    assert whole.stderr == "" and len(whole.stdout.splitlines()) == 5


@pytest.mark.parametrize(
    ("ending", "code"),
    [
        ("StreamIdleTimeout: no content for 30s", 3),
        ("ProviderError: HTTP 400 bad request", 1),
        (None, 1),  # cancelled
        ("", 0),  # done
    ],
)
def test_status_watch_exits_with_the_jobs_exit_code(
    url: str, ending: str | None, code: int
) -> None:
    """status --watch of a job that ended FAILED exits 1 (3 when a timeout failed it), of
    a CANCELLED one 1, of a DONE one 0: the codes `result` and the README document."""
    fence = acquire(url, "job-1")
    if ending:
        on_store(url, lambda store: store.fail(fence, ending))
    elif ending is None:
        on_store(url, lambda store: store.cancel("job-1", "stop"))
    else:
        on_store(url, lambda store: store.commit(fence, '"ok"'))
    watched = cli("--store", url, "status", "job-1", "--watch", "--interval", "0.1")
    assert watched.exit_code == code, watched.output


# -- 5. figures read from a record say how old they are ------------------------------------------


def renew_with_progress(url: str, fence: Fence) -> None:
    async def work(store: LeaseStore) -> None:
        await store.renew(
            fence, ttl=30, stage="call_ai", progress_version=1, max_no_progress=90, grace=5
        )

    on_store(url, work)


def test_ls_and_status_show_figures_as_of_the_last_heartbeat(url: str) -> None:
    """A job that progressed at its last renewal reads idle 0 at that heartbeat, with the
    heartbeat's age beside it (not a growing IDLE that is only the record's age), and its
    stage is labelled as reported at that heartbeat."""
    import time

    renew_with_progress(url, acquire(url, "streaming"))
    time.sleep(1.2)  # real: the CLI runs as a subprocess; figures age on the store's clock
    listed = cli("--store", url, "ls")
    header, row = listed.stdout.splitlines()
    assert header.split()[-2:] == ["IDLE", "BEAT"]
    cells = row.split()
    assert cells[3] == "call_ai" and cells[-5:-3] == ["0.00", "s"], row  # IDLE at the beat
    assert cells[-1] == "ago" and float(cells[-3]) >= 1.2, row  # BEAT: the record's age
    shown = dict(
        (line[:11].strip(), line[12:])
        for line in cli("--store", url, "status", "streaming").stdout.splitlines()
    )
    assert (
        shown["stage"].startswith("call_ai (at the last heartbeat, ") and "s ago)" in shown["stage"]
    )
    assert shown["progress"].startswith("version 1, idle 0.00 s (at the last heartbeat"), shown
    js = orjson.loads(cli("--store", url, "status", "streaming", "--json").stdout)
    assert js["idle_at_heartbeat"] == 0.0 and js["since_heartbeat"] >= 1.2


def test_workers_leaves_out_jobs_that_have_ended(url: str) -> None:
    """A worker's last beat named two jobs; one has ended DONE since: `workers` lists only
    the one still RUNNING, and counts it alone."""
    import time

    from ai_lease.lease.queue import WorkerInfo

    acquire(url, "still-running")
    done(url, "ended", "ok")
    info = WorkerInfo(
        "w-1", "host-a", 42, 2, 4, time.time(), time.time(), ("still-running", "ended")
    )
    on_store(url, lambda store: store.worker_beat(info, 30))  # type: ignore[attr-defined]
    shown = cli("--store", url, "workers")
    assert shown.exit_code == 0, shown.output
    row, jobs = shown.stdout.splitlines()[1:]
    assert row.split()[3] == "1/4" and jobs == "  running: still-running", shown.stdout
    [js] = map(orjson.loads, cli("--store", url, "workers", "--json").stdout.splitlines())
    assert js["jobs"] == ["still-running"] and js["running"] == 1
