"""``ai-lease demo --ui``: the demo's job in the dashboard, so the takeover is watched as a picture.

The dashboard is the real ``ai-lease ui`` (a child process on a free loopback port, over the
demo's own store). The demo prints the job page's address (and opens it in a browser unless
told not to) before the nodes start; when the demo is over the dashboard stays up for
``linger`` seconds (None: until Ctrl-C), so the finished timeline — two lanes, the lapse,
the takeover with its new token, the rejected late write — can be looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import tempfile
import time
import webbrowser
from collections.abc import AsyncIterator
from typing import TextIO
from urllib.parse import quote

import httpx
import orjson

from ai_lease.cli.ui_cmd import MISSING_EXTRA, listen_socket

__all__ = ["Dashboard", "check_port", "dashboard"]

HOST = "127.0.0.1"

_READY_S = 20.0  # how long the dashboard may take to answer /healthz


class Dashboard:
    """A running ``ai-lease ui`` child: its base URL."""

    def __init__(self, base_url: str, proc: asyncio.subprocess.Process) -> None:
        self.base_url, self.proc = base_url, proc

    def job_url(self, key: str) -> str:
        return f"{self.base_url}/jobs/{quote(key, safe='')}"


def ui_available() -> bool:
    """Whether the ``ui`` extra is installed."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, errors: TextIO) -> None:
    deadline = time.monotonic() + _READY_S
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                errors.seek(0)
                said = errors.read().strip().splitlines()
                raise RuntimeError(
                    f"the dashboard exited with {proc.returncode}"
                    + (f": {said[-1]}" if said else "")
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the dashboard did not answer {url}/healthz within {_READY_S:g} s")


def check_port(port: int | None) -> None:
    """Exit 2 with one line when ``port`` on 127.0.0.1 cannot be listened on (None: any)."""
    if port:
        listen_socket(HOST, port).close()


@contextlib.asynccontextmanager
async def dashboard(
    store_url: str, *, refresh: float = 0.5, port: int | None = None
) -> AsyncIterator[Dashboard]:
    """``ai-lease ui`` over ``store_url`` on 127.0.0.1 (``port``, or a free one), stopped on
    the way out."""
    if not ui_available():
        raise RuntimeError(MISSING_EXTRA)
    port = port or _free_port()
    with tempfile.TemporaryFile("w+") as errors:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ai_lease", "--store", store_url, "ui"),
            *("--host", HOST, "--port", str(port), "--refresh", str(refresh)),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=errors,
        )
        base_url = f"http://{HOST}:{port}"
        try:
            await _wait_ready(base_url, proc, errors)
            yield Dashboard(base_url, proc)
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def announce(
    board: Dashboard, key: str, out: TextIO, *, open_browser: bool, as_json: bool = False
) -> None:
    """Say where the job's page is (a JSON line with ``as_json``), and open it."""
    url = board.job_url(key)
    if as_json:
        out.write(orjson.dumps({"kind": "dashboard", "url": url}).decode() + "\n")
    else:
        out.write(f"dashboard: {url} (the jobs: {board.base_url}/jobs)\n\n")
    out.flush()
    if open_browser:
        with contextlib.suppress(Exception):  # no browser here: the address was printed
            webbrowser.open(url)


async def linger(
    board: Dashboard, key: str, out: TextIO, seconds: float | None, *, as_json: bool = False
) -> None:
    """Keep the dashboard up after the demo: ``seconds``, or until Ctrl-C (None)."""
    if seconds is not None and seconds <= 0:
        return
    until = "Ctrl-C stops it" if seconds is None else f"for {seconds:g} s, or until Ctrl-C"
    if as_json:
        out.write(orjson.dumps({"kind": "dashboard_lingers", "url": board.job_url(key)}).decode())
        out.write("\n")
    else:
        out.write(f"\nthe timeline stays at {board.job_url(key)} ({until})\n")
    out.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # here Ctrl-C is the way out, not an error
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
