"""Job keys with a control, format, or line/paragraph separator character are refused at
every entry point — the API, a job file, --key, and every command that names a key — with
exit 2, before any store is opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ai_lease.errors import JobSpecError
from ai_lease.job import Job

BAD = {
    "U+202E": "pay\u202egnp.exe",
    "U+2028": "a\u2028b",
    "U+2029": "a\u2029b",
    "U+0085": "a\x85b",
    "U+200B": "a\u200bb",
    "U+FEFF": "\ufeffkey",
    "C1 CSI": "a\x9b2Jb",
    "ESC": "a\x1b]0;t\x07",
    "tab": "a\tb",
}
GOOD = ("report-42", "tenant/7/job:1", "ключ", "数据-1", "a b", "emoji-🙂")


@pytest.mark.parametrize("key", BAD.values(), ids=BAD.keys())
def test_the_api_refuses_the_key(key: str) -> None:
    """Job(key) raises JobSpecError naming the rule (the key shown escaped)."""
    with pytest.raises(JobSpecError, match="no control, format"):
        Job(key, input="x")


@pytest.mark.parametrize("key", GOOD)
def test_ordinary_keys_are_fine(key: str) -> None:
    """Slashes, spaces, other scripts and emoji are keys."""
    assert Job(key, input="x").key == key


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    url = f"sqlite:///{cwd / 'never.db'}"
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", "--store", url, *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=cwd,
    )  # fmt: skip


def test_every_command_refuses_the_key_with_exit_2(tmp_path: Path) -> None:
    """status, result, events, cancel, retry, rm, submit --key and a job file's key: exit 2,
    nothing created."""
    key = BAD["U+202E"]
    (tmp_path / "job.toml").write_text(f'key = "{key}"\ninput = "x"\nprompt = "summarize"\n')
    runs = [[cmd, key] for cmd in ("status", "result", "events", "cancel", "retry", "rm")]
    runs += [["submit", "job.toml"], ["submit", "job.toml", "--key", BAD["U+2028"]]]
    for args in runs:
        done = _cli(args, tmp_path)
        assert done.returncode == 2, (args, done.returncode, done.stderr)
        assert "no control, format" in done.stderr and "\u202e" not in done.stderr, args
    assert not (tmp_path / "never.db").exists()


async def test_the_dashboard_refuses_such_a_key_in_its_urls(sqlite_store: object) -> None:
    """/jobs/KEY, its live stream and its actions with such a key are a 400 page, before any
    store read."""
    from urllib.parse import quote

    import httpx

    from tests.test_ui_app import serving

    async with serving(sqlite_store) as base, httpx.AsyncClient(base_url=base) as client:
        for name, key in BAD.items():
            quoted = quote(key, safe="")
            for method, path in (
                ("GET", f"/jobs/{quoted}"),
                ("GET", f"/live/jobs/{quoted}"),
                ("POST", f"/jobs/{quoted}/cancel"),
            ):
                answer = await client.request(method, path)
                assert answer.status_code == 400, (name, path, answer.status_code)
