"""The servers' venv is found where the suite says, and its absence is a failure that says
what to run (the suite never skips for want of it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.realservers.servers import cli_env, servers_python

pytestmark = pytest.mark.realserver


def test_missing_servers_python_says_what_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A Python that REAL_SERVERS_PYTHON names but that is not there is an error naming
    the variable, the path and scripts/test.sh."""
    missing = tmp_path / "nowhere" / "python"
    monkeypatch.setenv("REAL_SERVERS_PYTHON", str(missing))
    with pytest.raises(RuntimeError) as failed:
        servers_python()
    message = str(failed.value)
    assert "REAL_SERVERS_PYTHON" in message
    assert str(missing) in message
    assert "scripts/test.sh" in message


def test_a_python_without_the_servers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python that lacks llama-cpp-python's server (the test venv's own) is refused,
    saying which import failed."""
    monkeypatch.setenv("REAL_SERVERS_PYTHON", sys.executable)
    with pytest.raises(RuntimeError, match=r"cannot import llama_cpp\.server"):
        servers_python()


def test_the_servers_variable_is_not_one_the_cli_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """REAL_SERVERS_PYTHON, set for the whole run, reaches `ai-lease` children without
    making them refuse their settings (the CLI refuses unknown AI_LEASE_* variables);
    a developer's own AI_LEASE_* settings do not reach them."""
    import subprocess

    monkeypatch.setenv("REAL_SERVERS_PYTHON", "/x/python")
    monkeypatch.setenv("AI_LEASE_PROVIDER__MODEL", "from-the-developer")
    env = cli_env(AI_LEASE_PROVIDER__NAME="openai-compatible")
    assert env["REAL_SERVERS_PYTHON"] == "/x/python"
    assert "AI_LEASE_PROVIDER__MODEL" not in env
    shown = subprocess.run(
        [sys.executable, "-m", "ai_lease", "config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert '"openai-compatible"' in shown.stdout
