"""Hostile and careless input: files a worker must never open, unbounded preparation,
job files that would crash the CLI, and the user's API key kept to its own host."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from ai_lease import open_store
from ai_lease.job import Job, Status
from ai_lease.lease.queue import JobQueue
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.local import LocalExtractiveProvider
from ai_lease.run.config import RunConfig
from ai_lease.run.runner import Runner
from ai_lease.run.worker import Worker
from tests.harness.sse_server import SSEServer, chat_chunks, json_response, sse
from tests.test_cli_submit import REPO, run_cli, snapshot_db

SECRET = "worker-secret-value-0123456789"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    return env | extra


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "article.txt").write_text((REPO / "examples" / "article.txt").read_text())
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "article.txt"\n'
    )
    return tmp_path


async def run_cli_async(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 60
) -> tuple[int, str, str]:
    """The CLI in a subprocess, without blocking the loop a loopback server runs on."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ai_lease",
        *args,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- item 1: a worker never opens a path taken from the store ---------------------------------


def test_detached_submit_of_proc_environ_is_refused(workdir: Path) -> None:
    """submit --detach --input-file /proc/self/environ: exit 2, a clear line, nothing stored."""
    out = run_cli(
        "submit", "job.toml", "--detach", "--input-file", "/proc/self/environ", cwd=workdir
    )
    assert out.returncode == 2, out.stderr
    assert "pseudo-file" in out.stderr and "Traceback" not in out.stderr
    assert (
        not (workdir / ".ai-lease" / "ai-lease.db").exists()
        or snapshot_db(workdir / ".ai-lease" / "ai-lease.db") == {}
    )


def test_detached_submit_stores_the_text_not_the_path(workdir: Path) -> None:
    """A detached job's stored spec carries its input's text and no path at all."""
    out = run_cli("submit", "job.toml", "--detach", cwd=workdir)
    assert out.returncode == 0, out.stderr
    [record] = snapshot_db(workdir / ".ai-lease" / "ai-lease.db").values()
    spec = orjson.loads(record["spec"])  # type: ignore[index]
    assert spec["input_file"] is None
    assert spec["input"] == (workdir / "article.txt").read_text()


async def test_worker_never_opens_a_path_from_a_stored_spec(tmp_path: Path) -> None:
    """A stored spec naming a file the worker can read: the file's text reaches no record."""
    secret = tmp_path / "secret.env"
    secret.write_text(f"API_KEY={SECRET}. Another sentence here. And one more.\n")
    store = open_store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        assert isinstance(store, JobQueue)
        planted = Job("planted", input_file=str(secret))  # as an old or forged submit stores it
        await store.submit("planted", planted.to_spec(), planted.fingerprint())
        runner = Runner(
            store,
            provider=LocalExtractiveProvider(pace_s=0),
            config=RunConfig(record_history=False),
        )
        worker = Worker(store, runner, sweep_interval=0.05)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)  # real: a worker on a real store, given time to (not) open it
        worker.kill()
        await asyncio.wait_for(task, 10)
        record = await store.get("planted")
    finally:
        await store.aclose()
    assert record is not None and record.status is not Status.DONE
    assert SECRET not in orjson.dumps(record.to_dict()).decode()


@pytest.mark.parametrize("target", ["/proc/self/environ", "/dev/zero", "/sys/kernel/uevent_seqnum"])
def test_pseudo_files_are_refused_even_behind_a_link(tmp_path: Path, target: str) -> None:
    """read_input_file refuses /proc, /dev and /sys files, also reached through a symlink."""
    from ai_lease.errors import JobSpecError
    from ai_lease.inputs import read_input_file

    link = tmp_path / "innocent.txt"
    link.symlink_to(target)
    with pytest.raises(JobSpecError, match="pseudo-file"):
        read_input_file(link)


def test_fifo_input_is_refused_at_once(workdir: Path) -> None:
    """A FIFO as --input-file: refused with exit 2 at once, no hang."""
    fifo = workdir / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    out = run_cli("submit", "job.toml", "--input-file", str(fifo), cwd=workdir)
    assert out.returncode == 2 and "FIFO" in out.stderr, out.stderr
    assert time.monotonic() - started < 30  # real: the CLI is a subprocess


def test_input_beyond_max_input_bytes_is_refused(workdir: Path) -> None:
    """An input file over job.max_input_bytes: exit 2 naming the setting."""
    env = {"AI_LEASE_JOB__MAX_INPUT_BYTES": "100"}
    out = run_cli("submit", "job.toml", cwd=workdir, env=env)
    assert out.returncode == 2 and "job.max_input_bytes (100)" in out.stderr, out.stderr


def test_directory_input_is_refused(workdir: Path) -> None:
    """A directory as --input-file is bad input, one clear line."""
    out = run_cli("submit", "job.toml", "--input-file", str(workdir), cwd=workdir)
    assert out.returncode == 2 and "directory" in out.stderr, out.stderr


# -- item 17 and 13: bad job files are bad input ----------------------------------------------


def test_job_without_input_is_bad_input(workdir: Path) -> None:
    """No input and a template that uses it: exit 2, never a summary of 'None'."""
    (workdir / "noinput.toml").write_text('key = "j"\nprompt = "summarize"\n')
    out = run_cli("submit", "noinput.toml", cwd=workdir)
    assert out.returncode == 2 and "uses 'input'" in out.stderr, (out.stdout, out.stderr)


def test_job_without_input_runs_when_its_template_does_not_use_it(workdir: Path) -> None:
    """No input is fine for a template that does not use it."""
    (workdir / "plain.toml").write_text('key = "j"\nprompt_text = "Say hello. Then stop."\n')
    out = run_cli("submit", "plain.toml", "-q", cwd=workdir)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('key = "j"\ninput = "x"\n[variables]\nn = 99999999999999999999999\n', "64 bits"),
        ('key = "j"\ninput = "x"\n[variables]\nv = ' + "[" * 5000 + "]" * 5000 + "\n", "nested"),
        ('key = "j"\ninput = "x"\n[variables]\nv = ' + "[" * 40 + "]" * 40 + "\n", "nested"),
    ],
    ids=["huge-int", "deep-5000", "deep-40"],
)
def test_unbounded_job_file_values_are_bad_input(workdir: Path, text: str, says: str) -> None:
    """Integers past 64 bits and deep nesting in a job file: exit 2, one line, no traceback."""
    (workdir / "bad.toml").write_text(text)
    out = run_cli("submit", "bad.toml", cwd=workdir)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1


def test_deeply_nested_json_job_file_is_bad_input(workdir: Path) -> None:
    """A .json job file nested 100000 deep: exit 2, no RecursionError traceback."""
    (workdir / "bad.json").write_text(
        '{"key": "j", "variables": {"v": ' + "[" * 100000 + "]" * 100000 + "}}"
    )
    out = run_cli("submit", "bad.json", cwd=workdir)
    assert out.returncode == 2 and "nested" in out.stderr, out.stderr


# -- item 15: templates and the offline provider cannot exhaust a process ---------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ (10**(10**8)) % 7 }}",
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        "{% for i in range(99999) %}{{ 'many words ' * 1000 }}{% endfor %}",
    ],
    ids=["power", "nested-loops", "output"],
)
def test_heavy_templates_are_refused_in_bounded_time(workdir: Path, template: str) -> None:
    """CPU- or memory-heavy templates end in exit 2 within the render deadline."""
    (workdir / "heavy.toml").write_text(f'key = "j"\ninput = "x"\nprompt_text = """{template}"""\n')
    env = {"AI_LEASE_JOB__RENDER_TIMEOUT": "1", "AI_LEASE_JOB__MAX_PROMPT_CHARS": "1000000"}
    started = time.monotonic()
    try:
        out = run_cli("submit", "heavy.toml", cwd=workdir, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the template rendered past the CLI's 60 s")
    assert out.returncode == 2 and "refused" in out.stderr, out.stderr
    assert time.monotonic() - started < 30  # real: the CLI is a subprocess, rendering for real


async def test_local_provider_leaves_the_event_loop_free_on_a_big_input() -> None:
    """While the offline provider summarises ~12 MB, a ticker on the loop is never late by 1 s
    or by half the work's time, whichever is longer: on the loop it would be late by all of it
    (the keeper shares that loop and must renew). Relative, so a loaded machine slows both."""
    sentence = "Solar panels turn sunlight into electricity for the growing cities. "
    big = sentence * 180_000
    provider = LocalExtractiveProvider(pace_s=0)
    request = ChatRequest([{"role": "user", "content": f"<input>\n{big}\n</input>"}])
    lateness, stop = [0.0], asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)  # real: measures how late the loop's real timers are
            lateness[0] = max(lateness[0], time.monotonic() - before - 0.01)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)  # real: measures how late the loop's real timers are
    started = time.monotonic()
    completion = await provider.complete(request)
    took = time.monotonic() - started
    stop.set()
    await tick
    assert completion.text
    assert took > 1.0, f"the input was too small to show anything ({took:.2f}s)"
    bound = max(1.0, took / 2)
    assert lateness[0] < bound, f"the loop was blocked {lateness[0]:.2f}s of {took:.2f}s"


# -- item 2: a key goes only to the host it is configured for ---------------------------------


def _provider_job(workdir: Path, base_url: str) -> None:
    (workdir / "remote.toml").write_text(
        'key = "remote"\ninput = "One sentence. Two sentences."\nprompt = "summarize"\n'
        f'[provider]\nname = "openai-compatible"\nmodel = "m"\nbase_url = "{base_url}"\n'
    )


async def test_job_file_base_url_on_another_host_gets_no_key(workdir: Path) -> None:
    """A job file pointing [provider] base_url at another server: refused, that server
    receives nothing, and the error says how to allow the host."""
    async with SSEServer() as home, SSEServer() as foreign:
        _provider_job(workdir, foreign.base_url)
        foreign.enqueue(sse(*chat_chunks(["stolen"], usage=(1, 1))))
        env = clean_env(
            AI_LEASE_PROVIDER__NAME="openai-compatible",
            AI_LEASE_PROVIDER__BASE_URL=home.base_url,
            AI_LEASE_PROVIDER__API_KEY="zz-home-key-1234567",
        )
        code, _, err = await run_cli_async("submit", "remote.toml", cwd=workdir, env=env)
        assert code == 2, err
        assert "allowed_hosts" in err and "zz-home-key" not in err
        assert foreign.requests == [] and home.requests == []


async def test_ambient_openai_key_never_follows_a_job_file_elsewhere(workdir: Path) -> None:
    """OPENAI_API_KEY in the environment, a job file naming a loopback base_url: refused."""
    async with SSEServer() as foreign:
        _provider_job(workdir, foreign.base_url)
        foreign.enqueue(sse(*chat_chunks(["stolen"], usage=(1, 1))))
        env = clean_env(OPENAI_API_KEY="zz-ambient-key-98765")
        code, _, err = await run_cli_async("submit", "remote.toml", cwd=workdir, env=env)
        assert code == 2 and "allowed_hosts" in err, err
        assert all("authorization" not in r.headers for r in foreign.requests)
        assert foreign.requests == []


async def test_allowed_host_receives_the_key(workdir: Path) -> None:
    """A host listed in provider.allowed_hosts is sent the configured key."""
    async with SSEServer() as home, SSEServer() as other:
        _provider_job(workdir, other.base_url)
        other.enqueue(sse(*chat_chunks(["Fine."], usage=(1, 1))))
        env = clean_env(
            AI_LEASE_PROVIDER__BASE_URL=home.base_url,
            AI_LEASE_PROVIDER__API_KEY="zz-home-key-1234567",
            AI_LEASE_PROVIDER__ALLOWED_HOSTS=f"127.0.0.1:{other.port}",
        )
        code, _, err = await run_cli_async("submit", "remote.toml", "-q", cwd=workdir, env=env)
        assert code == 0, err
        [request] = other.requests
        assert request.headers["authorization"] == "Bearer zz-home-key-1234567"


# -- items 3 and 4: configured secrets never leave the process --------------------------------

KEY = "zz-opaque-key-31415926535"  # no well-known shape: only the registered value masks it


async def test_key_echoed_by_a_401_reaches_no_output_record_or_log(workdir: Path) -> None:
    """A server echoing the key in its 401 body: the key is in none of the CLI's stderr,
    the stored record, or a worker's --log-json lines."""
    async with SSEServer() as server:
        body = {"error": {"message": f"Incorrect API key provided: {KEY}", "code": "bad_key"}}
        server.enqueue(*[json_response(401, body) for _ in range(4)])
        env = clean_env(
            AI_LEASE_PROVIDER__NAME="openai-compatible",
            AI_LEASE_PROVIDER__BASE_URL=server.base_url,
            AI_LEASE_PROVIDER__MODEL="m",
            AI_LEASE_PROVIDER__API_KEY=KEY,
        )
        code, out, err = await run_cli_async("submit", "job.toml", cwd=workdir, env=env)
        assert code == 1 and "401" in err, err
        assert KEY not in out + err
        code, out, err = await run_cli_async("status", "job-1", "--json", cwd=workdir, env=env)
        assert code == 0 and '"FAILED"' in out and KEY not in out + err

        (workdir / "job2.toml").write_text('key = "job-2"\ninput_file = "article.txt"\n')
        code, _, err = await run_cli_async("submit", "job2.toml", "--detach", cwd=workdir, env=env)
        assert code == 0, err
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "ai_lease", "worker", "--log-json", "--sweep-interval", "0.1"],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            for _ in range(200):
                await asyncio.sleep(0.1)  # real: the CLI is a subprocess beside a loopback server
                code, out, _ = await run_cli_async(
                    "status", "job-2", "--json", cwd=workdir, env=env
                )
                if '"FAILED"' in out:
                    break
        finally:
            proc.terminate()
            _, logs = await asyncio.wait_for(proc.communicate(), 30)
    assert '"FAILED"' in out and KEY not in out
    lines = logs.decode().splitlines()
    assert any("401" in line for line in lines), lines
    assert all(KEY not in line for line in lines)


def test_config_masks_a_password_in_the_provider_base_url(workdir: Path) -> None:
    """`ai-lease config` prints a base_url with user:password@ masked."""
    env = {"AI_LEASE_PROVIDER__BASE_URL": "https://bob:hunter2secret@llm.example/v1"}
    out = run_cli("config", cwd=workdir, env=env)
    assert out.returncode == 0, out.stderr
    assert "hunter2secret" not in out.stdout and "llm.example" in out.stdout


@pytest.mark.parametrize("char", ["\u202e", "\u2028", "\u0085", "\x07", " "])
@pytest.mark.parametrize("variable", ["AI_LEASE_PROVIDER__API_KEY", "OPENAI_API_KEY"])
def test_keys_with_invisible_characters_are_refused(
    workdir: Path, char: str, variable: str
) -> None:
    """A key holding a bidi override, a line separator or a control character: exit 2,
    naming the code point, never echoing the key raw."""
    key = f"zz-good{char}part-123456"
    (workdir / "remote.toml").write_text(
        'key = "k"\ninput = "A. B."\n[provider]\nname = "openai-compatible"\n'
        'base_url = "https://api.openai.com/v1"\n'
    )
    out = run_cli("submit", "remote.toml", cwd=workdir, env={variable: key})
    assert out.returncode == 2, out.stderr
    assert f"U+{ord(char):04X}" in out.stderr
    assert char not in out.stderr.replace("\n", "") or char == " "
    assert "zz-good" not in out.stderr


def test_a_strange_ambient_key_does_not_break_the_offline_provider(workdir: Path) -> None:
    """local-extractive sends no key: an odd OPENAI_API_KEY is neither read nor refused."""
    out = run_cli("submit", "job.toml", "-q", cwd=workdir, env={"OPENAI_API_KEY": "a\u202eb"})
    assert out.returncode == 0, out.stderr


def test_a_huge_key_is_never_echoed_whole(workdir: Path) -> None:
    """A 10 KB key: refused (exit 2) with its length, the error line short."""
    key = "zz" + "k" * 10_240
    out = run_cli("submit", "job.toml", cwd=workdir, env={"AI_LEASE_PROVIDER__API_KEY": key})
    assert out.returncode == 2 and "10242 characters" in out.stderr, out.stderr[:300]
    assert len(out.stderr) < 500


# -- item 19: relative paths follow the job file ----------------------------------------------


def test_input_file_and_prompts_are_found_beside_the_job_file(tmp_path: Path) -> None:
    """Run from another directory: the job file's input_file and its prompts/ folder are
    found beside the job file, --prompts DIR first."""
    project = tmp_path / "project"
    (project / "prompts").mkdir(parents=True)
    (project / "text.txt").write_text("Alpha is first. Beta is second. Gamma is third.")
    (project / "prompts" / "mine.j2").write_text(
        "Repeat in 1 sentences:\n<input>\n{{ input }}\n</input>"
    )
    (project / "job.toml").write_text('key = "p"\nprompt = "mine"\ninput_file = "text.txt"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_cli("submit", str(project / "job.toml"), "-q", cwd=elsewhere)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(".") and len(out.stdout.split(". ")) == 1

    override = tmp_path / "override"
    override.mkdir()
    (override / "mine.j2").write_text("{{ input | upper }}")
    (project / "job.toml").write_text('key = "p2"\nprompt = "mine"\ninput_file = "text.txt"\n')
    out = run_cli(
        "submit", str(project / "job.toml"), "-q", "--prompts", str(override), cwd=elsewhere
    )
    assert out.returncode == 0, out.stderr
    assert "ALPHA IS FIRST." in out.stdout


def test_runner_reads_a_jobs_input_file_on_the_callers_side(workdir: Path) -> None:
    """Runner.run with Job(input_file=...) reads the file itself (the Python API submits)."""

    async def main() -> str:
        store = open_store(f"sqlite:///{workdir / 'api.db'}")
        try:
            runner = Runner(store, provider=LocalExtractiveProvider(pace_s=0))
            record = await runner.run(Job("api", input_file=str(workdir / "article.txt")))
            return str(record.output)
        finally:
            await store.aclose()

    assert asyncio.run(main())
