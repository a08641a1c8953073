"""What the CLI prints to a terminal is shown, never obeyed: OSC, CSI, C1 controls, bidi
and separator characters from a provider's error body or a model's answer are written as
visible escapes on a terminal (a real pseudo-terminal here), and as they are to a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest

from ai_lease.text_safety import UNSAFE, inert

HOSTILE = "\x1b]0;pwned\x07 \x9b31m \u202eevil\u2028next \x1b[2J\x85 \u200bzw"
# what must not arrive raw (the live panel's own CSI escapes may: rich draws with them)
RAW = ("\x1b]", "\x07", "\x9b", "\u202e", "\u2028", "\x85", "\u200b", "\x1b[2J")

PLUGIN = """
from ai_lease.errors import ProviderError
from ai_lease.providers.base import Completion, Delta

HOSTILE = {hostile!r}

class Hostile:
    name = "hostile"
    async def stream(self, request):
        if "fail" in request.messages[-1]["content"]:
            raise ProviderError("HTTP 400: " + HOSTILE, retryable=False, status=400)
        yield Delta(text="answer " + HOSTILE)
        yield Delta(finish_reason="stop")
    async def complete(self, request):
        raise AssertionError("streamed only")
    async def aclose(self):
        pass

def make(**options):
    return Hostile()
"""


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hostile_llm.py").write_text(textwrap.dedent(PLUGIN.format(hostile=HOSTILE)))
    dist = plugins / "hostile_llm-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-llm\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nhostile = hostile_llm:make\n")
    for key, text in (("ok", "fine"), ("bad", "fail")):
        body = f'key = "{key}"\ninput = "{text}"\nprompt_text = "{{{{ input }}}}"\n'
        (tmp_path / f"{key}.toml").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env |= {"PYTHONPATH": str(plugins), "AI_LEASE_PROVIDER__NAME": "hostile"}
    env |= {"AI_LEASE_STORE__URL": f"sqlite:///{tmp_path / 's.db'}", "TERM": "xterm"}
    return env


def on_terminal(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """``ai-lease ARGS`` with stdout and stderr on a pseudo-terminal: (exit code, what the
    terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ai_lease", *args],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, cwd=cwd,
    )  # fmt: skip
    os.close(slave)
    received = b""
    while True:
        try:
            chunk = os.read(master, 65_536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        received += chunk
    os.close(master)
    return proc.wait(60), received.decode("utf-8", "replace")


def test_an_error_body_and_an_answer_reach_a_terminal_inert(
    cli_env: dict[str, str], tmp_path: Path
) -> None:
    """submit (the error line and the answer), result, status and events on a terminal:
    none of the raw characters arrive, their escapes do."""
    runs = [
        (["submit", "bad.toml"], 1),
        (["submit", "ok.toml"], 0),
        (["result", "ok"], 0),
        (["status", "bad"], 0),
        (["events", "bad"], 0),
    ]
    for args, code in runs:
        got, shown = on_terminal(args, cli_env, tmp_path)
        assert got == code, (args, got, shown)
        leaked = [c for c in RAW if c in shown]
        assert not leaked, (args, leaked, shown)
        assert "\\x1b]0;pwned\\x07" in shown and "\\u202eevil" in shown, (args, shown)


def test_a_pipe_gets_the_answer_exactly(cli_env: dict[str, str], tmp_path: Path) -> None:
    """`ai-lease result KEY | …` is the model's text byte for byte."""
    subprocess.run(
        [sys.executable, "-m", "ai_lease", "submit", "ok.toml", "--quiet"],
        env=cli_env, cwd=tmp_path, capture_output=True, check=True,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "ai_lease", "result", "ok"],
        env=cli_env, cwd=tmp_path, capture_output=True, check=True,
    )  # fmt: skip
    assert done.stdout.decode() == "answer " + HOSTILE + "\n"


def test_unsafe_is_every_control_format_and_separator_character() -> None:
    """UNSAFE matches exactly Cc (but tab and newline), Cf, Zl, Zp and surrogates (and the
    format characters Unicode 15 added, should this Python's tables be older)."""
    newer = {chr(c) for c in range(0x13439, 0x13440)}  # format characters from Unicode 15
    for code in range(0x110000):
        char = chr(code)
        category = unicodedata.category(char)
        expected = category in ("Cf", "Zl", "Zp", "Cs") or (category == "Cc" and char not in "\t\n")
        assert bool(UNSAFE.fullmatch(char)) == (expected or char in newer), hex(code)
    assert inert("a\tb\nc") == "a\tb\nc"
