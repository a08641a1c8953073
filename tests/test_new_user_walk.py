"""The README's CLI list, walked as a new user would: a fresh directory, every command of the
synopsis pasted with its optional parts left out (only ``JOB_FILE`` and ``KEY`` filled in),
each ending with the exit code the README documents for it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.doc_blocks import ROOT, clean_env, doc_blocks

REAL_TIME = "every command runs as a subprocess, as a new user runs it"


pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEY = "example-summary"  # examples/summarize.toml's key
# The exit code the README documents for each command of the walk, in the README's order,
# on the job the walk's `submit` just finished (DONE):
DOCUMENTED = {
    "submit": 0,  # "0 done"
    "status": 0,
    "ls": 0,
    "result": 0,  # "the stored result (exit 1 if FAILED, 3 if not finished)"
    "events": 0,
    "cancel": 2,  # "exits 2 when it had already ended DONE or FAILED (nothing changed)"
    "retry": 2,  # "retry … exit 2 … retry of a job not FAILED or CANCELLED"
    "rm": 0,  # a DONE job has no live lease: removed
    "prune": 0,
    "worker": 0,  # "SIGTERM/SIGINT drains a worker … and exits 0"
    "workers": 0,
    "tune": 0,
    "providers": 0,
    "config": 0,
    "migrate": 0,  # "exit 2 if refused": SQLite needs none, nothing refused
    "demo": 0,
}
LOOKS = ("status", "ls", "result", "events", "workers", "tune")  # read-only commands


def synopsis() -> list[str]:
    """The CLI section's synopsis: one `ai-lease …` command per entry, without its comments
    and with its [optional] parts left out."""
    block = next(b for b in doc_blocks() if b.not_run and b.not_run.startswith("synopsis"))
    commands = []
    for line in block.text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("ai-lease "):
            continue  # a continuation of the line above (more optional flags)
        while re.search(r"\[[^\[\]]*\]", line):
            line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
        commands.append(line)
    return commands


def new_user_dir(tmp_path: Path) -> Path:
    """A fresh directory with the README's example job copied in (the user's own file)."""
    home = tmp_path / "new-user"
    home.mkdir()
    shutil.copy(ROOT / "examples" / "summarize.toml", home / "job.toml")
    shutil.copy(ROOT / "examples" / "article.txt", home / "article.txt")
    return home


def paste(
    command: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    line = command.replace("JOB_FILE", "job.toml").replace("KEY", KEY)
    env = clean_env() | (env or {})
    if line.split()[1] == "worker":
        return _run_until_sigterm(line, cwd, env)
    return subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _run_until_sigterm(
    line: str, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A worker runs until it is told to stop: up for a few seconds, then SIGTERM."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {line}"], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_synopsis_lists_every_command_the_walk_expects() -> None:
    """The walk covers every command the README lists, and nothing it does not."""
    assert [c.split()[1] for c in synopsis()] == list(DOCUMENTED)


@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_a_new_user_walks_the_cli_list(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each command of the README's CLI list, pasted in order, exits as the README says: on
    the default SQLite store, and with every command pointed at Redis or PostgreSQL the way
    the README says (``AI_LEASE_STORE__URL``)."""
    home = new_user_dir(tmp_path)
    env: dict[str, str] = {}
    if backend == "redis":
        redis = request.getfixturevalue("redis_server")
        redis.flushall()
        env["AI_LEASE_STORE__URL"] = redis.url
    elif backend == "postgres":
        pg = request.getfixturevalue("pg_server")
        pg.terminate_backends()
        pg.reset_all()
        env["AI_LEASE_STORE__URL"] = pg.url
    seen = []
    for command in synopsis():
        ran = paste(command, home, env)
        name = command.split()[1]
        seen.append((command, ran.returncode))
        assert ran.returncode == DOCUMENTED[name], (
            f"`{command}` exited {ran.returncode}, the README says {DOCUMENTED[name]}\n"
            f"stdout: {ran.stdout[-2000:]}\nstderr: {ran.stderr[-2000:]}\nbefore: {seen}"
        )
        if name == "config":
            json.loads(ran.stdout)  # the effective settings: JSON a user can read back
        if name == "ls":
            assert KEY in ran.stdout, ran.stdout
    if env:  # every command went to the store it was pointed at, none made the default one
        assert not (home / ".ai-lease").exists(), sorted(p.name for p in home.iterdir())


@pytest.mark.parametrize("look", LOOKS)
def test_a_look_in_a_fresh_directory_creates_nothing(look: str, tmp_path: Path) -> None:
    """A read-only command before any submit leaves the directory empty and says so."""
    home = tmp_path / "empty"
    home.mkdir()
    command = next(c for c in synopsis() if c.split()[1] == look)
    ran = paste(command, home)
    assert list(home.iterdir()) == [], f"`{command}` created {sorted(os.listdir(home))}"
    assert "no store" in ran.stdout + ran.stderr, (ran.returncode, ran.stdout, ran.stderr)
