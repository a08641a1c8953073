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


def test_cli_children_get_no_foreign_ai_lease_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """An `ai-lease` child started by the suite does not inherit REAL_SERVERS_PYTHON
    (the CLI refuses unknown AI_LEASE_* variables), only the settings it is given."""
    monkeypatch.setenv("REAL_SERVERS_PYTHON", "/x/python")
    env = cli_env(AI_LEASE_PROVIDER__NAME="openai-compatible")
    assert "REAL_SERVERS_PYTHON" not in env
    assert env["AI_LEASE_PROVIDER__NAME"] == "openai-compatible"
