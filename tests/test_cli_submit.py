"""`ai-lease submit`, `result` and bad input, run through the real entry point."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ai_lease import open_store
from tests.harness.redis_server import free_port

REPO = Path(__file__).resolve().parent.parent


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def snapshot_db(db: Path) -> dict[str, object]:
    """Every stored record, for checking that bad input changed nothing."""

    async def read() -> dict[str, object]:
        import sqlite3

        conn = sqlite3.connect(db)
        keys = [k for (k,) in conn.execute("SELECT key FROM ai_lease_jobs")]
        conn.close()
        store = open_store(f"sqlite:///{db}")
        try:
            return {k: (await store.get(k)).to_dict() | {"read_at": 0} for k in keys}  # type: ignore[union-attr]
        finally:
            await store.aclose()

    return asyncio.run(read())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "article.txt").write_text((REPO / "examples" / "article.txt").read_text())
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "article.txt"\n'
        "[variables]\nsentences = 2\n"
    )
    return tmp_path


def test_submit_runs_a_real_job_on_the_embedded_store(workdir: Path) -> None:
    """submit on a fresh directory: exit 0, a summary of the input, stored under the key."""
    out = run_cli("submit", "job.toml", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "zombie owner" not in out.stdout or "lease" in out.stdout
    assert len(out.stdout.strip().split(". ")) == 2, out.stdout
    assert "committed" in out.stderr and "acquired" in out.stderr
    again = run_cli("result", "job-1", cwd=workdir)
    assert again.returncode == 0 and again.stdout == out.stdout


def test_submit_json_and_quiet(workdir: Path) -> None:
    """--json prints the final record; --quiet prints only the result; a rerun is instant."""
    js = run_cli("submit", "job.toml", "--json", cwd=workdir)
    assert js.returncode == 0 and '"status": "DONE"' in js.stdout and js.stderr == ""
    quiet = run_cli("submit", "job.toml", "-q", cwd=workdir)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout.strip()


def test_flags_override_the_job_file(workdir: Path) -> None:
    """--key and --input override the file; the new key gets its own result."""
    out = run_cli(
        "submit", "job.toml", "--key", "other", "--input", "One. Two. Three.", "-q", cwd=workdir
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in {"One. Two.", "One. Three.", "Two. Three."}


BAD_FILES = {
    "syntax": ('key = "k"\nprompt = \n', r"line 2, column \d+"),
    "unknown-field": ('key = "k"\nprompt_name = "x"\n', "unknown field 'prompt_name'"),
    "bad-type": ('key = "k"\nstream = "yes"\n', "'stream' must be bool"),
    "missing-template": (
        'key = "k"\nprompt = "nope"\ninput = "x"\n',
        "prompt template 'nope' not found.*summarize",
    ),
    "missing-variable": (
        'key = "k"\nprompt_text = "{{ input }} for {{ who }}"\ninput = "x"\n',
        "'who' is undefined",
    ),
    "unknown-provider": (
        'key = "k"\ninput = "x"\n[provider]\nname = "gpt-llama"\n',
        "unknown provider 'gpt-llama'.*local-extractive",
    ),
    "no-api-key": (
        'key = "k"\ninput = "x"\n[provider]\nname = "openai"\nmodel = "gpt-4o"\n',
        "OPENAI_API_KEY",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_job_file_is_one_clear_line_and_changes_nothing(workdir: Path, case: str) -> None:
    """Each bad input exits 2 with one line naming the problem; stored jobs are intact."""
    assert run_cli("submit", "job.toml", "-q", cwd=workdir).returncode == 0
    db = workdir / ".ai-lease" / "ai-lease.db"
    before = snapshot_db(db)
    text, pattern = BAD_FILES[case]
    (workdir / "bad.toml").write_text(text)
    out = run_cli("submit", "bad.toml", cwd=workdir, env={"OPENAI_API_KEY": ""})
    assert out.returncode == 2, (out.returncode, out.stderr)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ai-lease: error:") and "Traceback" not in out.stderr
    import re

    assert re.search(pattern, last), last
    after = snapshot_db(db)
    assert set(after) - set(before) <= {"k"}
    assert {k: v for k, v in after.items() if k in before} == before
    debug = run_cli("--debug", "submit", "bad.toml", cwd=workdir, env={"OPENAI_API_KEY": ""})
    assert "Traceback" in debug.stderr


def test_unreachable_redis_is_one_clear_line(workdir: Path) -> None:
    """A Redis nobody listens on: exit 4, one line naming the masked URL, quickly."""
    url = f"redis://:sk-CANARY@127.0.0.1:{free_port()}/0"
    out = run_cli("--store", url, "submit", "job.toml", cwd=workdir)
    assert out.returncode == 4, out.stderr
    assert "CANARY" not in out.stderr and "127.0.0.1" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_job_file_is_bad_input(workdir: Path) -> None:
    """A job file that does not exist exits 2 naming it."""
    out = run_cli("submit", "nope.toml", cwd=workdir)
    assert out.returncode == 2 and "nope.toml" in out.stderr


def test_result_of_unknown_and_failed_jobs(workdir: Path) -> None:
    """result: unknown key exits 2 (no store yet: 4); the providers command lists the
    built-ins."""
    assert run_cli("result", "never", cwd=workdir).returncode == 4  # a look creates no store
    assert not (workdir / ".ai-lease").exists()

    async def make() -> None:
        store = open_store(f"sqlite:///{workdir}/.ai-lease/ai-lease.db")
        await store.get("other")
        await store.aclose()

    asyncio.run(make())
    assert run_cli("result", "never", cwd=workdir).returncode == 2
    listed = run_cli("providers", cwd=workdir)
    assert {"local-extractive", "openai", "openai-compatible"} <= set(listed.stdout.split())


@pytest.mark.parametrize("http", ["auto", "httpx"])
async def test_submit_streams_from_an_openai_compatible_server(workdir: Path, http: str) -> None:
    """The README's OpenAI-compatible setup, end to end over loopback, on either HTTP path."""
    from tests.harness.sse_server import SSEServer, chat_chunks, sse

    async with SSEServer() as server:
        server.enqueue(sse(*chat_chunks(["A short ", "summary."], usage=(12, 3))))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
        env |= {
            "AI_LEASE_PROVIDER__NAME": "openai-compatible",
            "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
            "AI_LEASE_PROVIDER__MODEL": "qwen2.5:7b",
            "AI_LEASE_PROVIDER__HTTP": http,
        }
        proc = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "ai_lease", "submit", "job.toml", "--quiet"],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "A short summary." in out.decode()
    [request] = server.requests
    assert request.json["model"] == "qwen2.5:7b" and request.json["stream"] is True
