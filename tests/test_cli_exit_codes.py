"""Exit codes as the README and `--help` state them: 3 for any timeout (stream first-token,
idle and total budgets, a stage's hard deadline, the job's deadline), 2 for bad options,
never a traceback. Timeouts are played by a loopback SSE server that stalls; the CLI runs
as a subprocess, as users run it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ai_lease.cli.app import main
from tests.harness.sse_server import Hang, Response, Sleep, SSEServer, chat_chunks, drip, sse
from tests.test_cli_lifecycle import _on

ONE_ATTEMPT = {"AI_LEASE_RETRY__ATTEMPTS": "1"}


def stalls(kind: str) -> tuple[dict[str, str], list[Response]]:
    """Settings and a server script making the one attempt run out of ``kind``'s budget."""
    slow = [sse(*drip("slowly " * 40, every=0.05)) for _ in range(6)]
    if kind == "first_token":
        return {"AI_LEASE_STREAM__FIRST_TOKEN": "0.3"}, [sse(Hang()) for _ in range(6)]
    if kind == "idle":
        started = [sse(*chat_chunks(["Hel"], finish_reason=None), Sleep(0), Hang())]
        return {"AI_LEASE_STREAM__IDLE": "0.3"}, started * 6
    if kind == "total":
        return {"AI_LEASE_STREAM__TOTAL": "0.5"}, slow
    if kind == "stage_deadline":
        return {"AI_LEASE_STAGES__CALL_AI__DEADLINE": "0.5"}, slow
    assert kind == "job_deadline"
    return {"AI_LEASE_LEASE__JOB_DEADLINE": "0.8"}, slow


async def run_submit(server: SSEServer, workdir: Path, extra: dict[str, str]) -> tuple[int, str]:
    env = {
        "AI_LEASE_PROVIDER__NAME": "openai-compatible",
        "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
        "AI_LEASE_PROVIDER__MODEL": "m",
        **ONE_ATTEMPT,
        **extra,
    }
    return await run_cli(workdir, env, "submit", "job.toml", "--quiet")


async def run_cli(workdir: Path, extra: dict[str, str], *args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env |= extra
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "ai_lease", *args],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "job.toml").write_text(
        'key = "slow-1"\nprompt = "summarize"\ninput = "One. Two. Three."\n'
    )
    return tmp_path


@pytest.mark.parametrize("kind", ["first_token", "idle", "total", "stage_deadline", "job_deadline"])
async def test_any_timeout_exits_3(workdir: Path, kind: str) -> None:
    """A job whose last attempt ran out of a time budget exits 3 ("timed out"), with one
    error line and no traceback, whichever budget it was."""
    settings, script = stalls(kind)
    async with SSEServer() as server:
        server.enqueue(*script)
        code, err = await run_submit(server, workdir, settings)
    assert code == 3, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ai-lease: error: ")
    later, err = await run_cli(workdir, {}, "result", "slow-1")
    assert later == 3, err  # the stored FAILED record says so too


async def test_a_failure_that_is_no_timeout_still_exits_1(workdir: Path) -> None:
    """A job that failed for another reason (a 400 from the model) keeps exit 1."""
    from tests.harness.sse_server import json_response

    async with SSEServer() as server:
        server.enqueue(*[json_response(400, {"error": {"message": "bad request"}})] * 4)
        code, err = await run_submit(server, workdir, {})
    assert code == 1, err


def test_help_states_the_exit_codes() -> None:
    """`ai-lease --help` and `submit --help` give the same exit codes as the README."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "**3** timed out (any timeout" in readme
    for args in (["--help"], ["submit", "--help"]):
        out = CliRunner().invoke(main, args).output
        assert "3 timed out" in " ".join(out.split()), out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["tune", "--factor", "-1"], "'--factor'"),
        (["tune", "--factor", "nan"], "'--factor'"),
        (["tune", "--floor", "inf"], "'--floor'"),
        (["tune", "--min-samples", "0"], "'--min-samples'"),
        (["ls", "--limit", "1e20"], "'--limit'"),
        (["ls", "--limit", "99999999999999999999"], "'--limit'"),
        (["ls", "--limit", "0"], "'--limit'"),
    ],
)
def test_bad_numbers_in_options_are_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    """Out-of-range, nan or inf option values: a usage error naming the option, exit 2."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    out = CliRunner().invoke(main, ["--store", url, *args])
    assert out.exit_code == 2, out.output
    assert says in out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)


def test_tune_write_to_a_directory_is_exit_2(tmp_path: Path) -> None:
    """tune --write DIR (even with --force) is refused with a clear line, no traceback."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    for extra in ([], ["--force"]):
        out = CliRunner().invoke(main, ["--store", url, "tune", "--write", str(tmp_path), *extra])
        assert out.exit_code == 2, out.output
        assert "is a directory" in out.output
        assert out.exception is None or isinstance(out.exception, SystemExit)


def test_tune_write_where_it_cannot_is_exit_2(tmp_path: Path) -> None:
    """tune --write into a missing folder: one error line naming the path, exit 2."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    _on(url, lambda store: store.get("other"))  # the store exists (submit made it)
    target = tmp_path / "missing" / "tuned.toml"
    out = CliRunner().invoke(main, ["--store", url, "tune", "--write", str(target)])
    assert out.exit_code == 2, out.output
    assert f"cannot write {str(target)!r}" in out.output
