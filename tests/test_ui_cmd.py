"""`ai-lease ui` and `ai-lease demo --ui` on a real loopback port: a port in use is one line
and exit 2; the address is printed only once the server answers there."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ai_lease import open_store


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """An SQLite store that exists (the dashboard only looks: it never creates one)."""
    url = f"sqlite:///{tmp_path / 'ai-lease.db'}"

    async def make() -> None:
        store = open_store(url)
        await store.get("any")  # the first operation creates the file
        await store.aclose()

    asyncio.run(make())
    return url


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 another program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ui_on_a_port_in_use_is_one_line_and_exit_2(busy_port: int, sqlite_url: str) -> None:
    """`ai-lease ui --port P` with P taken: exit 2, one line naming the port and --port, no
    address printed, no raw errno."""
    done = cli("--store", sqlite_url, "ui", "--port", str(busy_port), cwd=Path.cwd())
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.splitlines() == [
        f"ai-lease: error: port {busy_port} on 127.0.0.1 is in use: pick another with --port"
    ]
    assert "http://" not in done.stdout + done.stderr


def test_ui_prints_its_address_once_it_answers_there(sqlite_url: str) -> None:
    """The address `ai-lease ui --port 0` prints is the real port, and it answers at once."""
    args = [sys.executable, "-m", "ai_lease", "--store", sqlite_url, "ui", "--port", "0"]
    with subprocess.Popen(args, env=env(), stderr=subprocess.PIPE, text=True) as server:
        try:
            assert server.stderr is not None
            line = server.stderr.readline()
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert found and found.group(1) != "0", line
            health = httpx.get(found.group(0) + "healthz", timeout=10)
            assert (health.status_code, health.text) == (200, "ok")
        finally:
            server.terminate()
            server.communicate(timeout=20)


def test_demo_ui_on_a_port_in_use_is_one_line_and_exit_2(busy_port: int, tmp_path: Path) -> None:
    """`ai-lease demo --ui --port P` with P taken: exit 2 with the same line, before any
    node starts."""
    done = cli("demo", "--ui", "--no-open", "--port", str(busy_port), cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"ai-lease: error: port {busy_port} on 127.0.0.1 is in use: pick another with --port"
    ]
    assert "race for job" not in done.stdout
