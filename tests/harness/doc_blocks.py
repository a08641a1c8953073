"""The fenced code blocks of the README and docs/, and running one as a user would paste it.

    for block in doc_blocks():            # every ```python / ```sh block, file and line known
        block.where                       # "README.md:148"
        block.not_run                     # the reason of a ``<!-- not run: … -->`` right above

A block runs in a fresh directory with an environment cleaned of the developer's own
``AI_LEASE_*`` / ``OPENAI*`` settings and this interpreter's ``bin`` first on ``PATH`` (so
``ai-lease``, ``python`` and ``pip`` are the installed package's). Shell blocks run in a new
session (their background jobs are killed with it); a line that serves until Ctrl-C is run
on its own, interrupted once it answers HTTP, as a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REAL_TIME = "the docs' commands run as processes; it waits on their HTTP and output"


__all__ = ["ROOT", "Block", "Ran", "clean_env", "doc_blocks", "run_bash", "serve_then_interrupt"]

ROOT = Path(__file__).resolve().parents[2]
LANGS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the opening fence's line, 1-based
    lang: str  # "python" or "sh"
    text: str
    not_run: str | None  # the annotation's reason, or None: the block runs

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0].strip() if self.text.strip() else ""


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_blocks() -> list[Block]:
    """Every python and shell block of README.md and docs/*.md, in file order."""
    found: list[Block] = []
    for path in doc_files():
        lines = path.read_text().splitlines()
        index = 0
        while index < len(lines):
            match = _FENCE.match(lines[index])
            if not match:
                index += 1
                continue
            end = index + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            lang = LANGS.get(match.group(1))
            if lang is not None:
                above = lines[index - 1] if index > 0 else ""
                note = _NOT_RUN.match(above)
                text = "\n".join(lines[index + 1 : end]) + "\n"
                found.append(Block(path, index + 1, lang, text, note and note.group(1)))
            index = end + 1
    return found


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without the developer's ai_lease/OpenAI settings, with this
    interpreter's ``bin`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["BROWSER"] = "true"  # `demo --ui` opens "the browser": a no-op command here
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Ran:
    code: int
    output: str


async def run_bash(script: str, cwd: Path, env: dict[str, str], timeout_s: float = 300.0) -> Ran:
    """``bash -e -c script`` in its own session, its output to a file (a background job
    may keep writing); once bash exits its whole process group is killed."""
    log = cwd / f"bash-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-e", "-c", script, cwd=cwd, env=env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        code = await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        code = -9
    finally:
        _kill_group(proc.pid)
        await proc.wait()
    text = log.read_text(errors="replace")
    return Ran(code, text if code != -9 else f"{text}\n(timed out after {timeout_s:g} s)")


async def serve_then_interrupt(
    line: str, ready: str, cwd: Path, env: dict[str, str], timeout_s: float = 90.0
) -> Ran:
    """Run ``line`` (a command that serves until Ctrl-C); once it is ready — ``ready`` is a URL
    that answers any HTTP status, or else a text its output shows —, SIGINT its process group
    as a terminal's Ctrl-C would and wait for the exit."""
    log = cwd / f"serve-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", line, cwd=cwd, env=env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        if ready.startswith("http"):
            answered = await _wait_http(ready, proc, timeout_s)
        else:
            answered = await _wait_text(ready, log, proc, timeout_s)
        if answered:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 30.0)
        text = log.read_text(errors="replace")
        return Ran(code, text if answered else f"(never ready: {ready})\n{text}")
    finally:
        _kill_group(proc.pid)
        await proc.wait()


async def _wait_http(url: str, proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline and proc.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                await client.get(url)
                return True
            await asyncio.sleep(0.2)
    return False


async def _wait_text(
    text: str, log: Path, proc: asyncio.subprocess.Process, timeout_s: float
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.returncode is None:
        if text in await asyncio.to_thread(log.read_text, errors="replace"):
            return True
        await asyncio.sleep(0.2)
    return False


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
