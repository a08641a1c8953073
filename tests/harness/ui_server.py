"""The real dashboard, ``python -m ai_lease ui``, as a child process on a free loopback port.

    with UIServer("sqlite:////tmp/t/ai-lease.db", Path("/tmp/t")) as ui:
        httpx.get(ui.url("/jobs"))
        ...
    # stopped with SIGINT (as Ctrl-C would), killed only if it does not stop in time

The store is named to the child by ``AI_LEASE_STORE__URL`` (the settings' environment
layer, as a user would); every other ``AI_LEASE_*`` variable of the test's environment is
dropped so the developer's own settings cannot leak in. The child's output goes to
``ui.log`` in ``directory``; a server that exits or never answers ``/healthz`` fails with
that log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx

from ai_lease import open_store
from tests.harness.redis_server import free_port

__all__ = ["STOP_TIMEOUT_S", "UIServer", "make_store", "run_ui", "ui_env"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0  # a loaded CI machine imports starlette and uvicorn slowly
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.1


def ui_env(store_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``AI_LEASE_*``/``OPENAI*`` variable, plus the
    store URL (and ``extra``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env["AI_LEASE_STORE__URL"] = store_url
    env.update(extra or {})
    return env


def make_store(store_url: str) -> None:
    """Create the store at ``store_url`` if it is not there (``ai-lease ui`` only looks: it
    exits 4 on a store that does not exist). Runs on a thread of its own, so a caller inside
    an event loop may call it too."""
    from concurrent.futures import ThreadPoolExecutor

    async def touch() -> None:
        store = open_store(store_url)
        try:
            await store.get("any")  # the first operation creates it
        finally:
            await store.aclose()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, touch()).result()


def run_ui(
    store_url: str, directory: Path, *args: str, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ai_lease ui *args`` to its end (for a command that must refuse)."""
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", "ui", *args],
        cwd=directory,
        env=ui_env(store_url),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class UIServer:
    """One ``ai-lease ui`` child process serving ``store_url`` on 127.0.0.1."""

    def __init__(
        self,
        store_url: str,
        directory: Path,
        *,
        token: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.store_url, self.directory, self.token = store_url, directory, token
        self.extra_args = tuple(extra_args)
        self.port = free_port()
        self.log = directory / f"ui-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False  # set when stop() had to SIGKILL it

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + path

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "ai_lease", "ui", "--host", HOST, "--port", str(self.port)]
        if self.token is not None:
            args += ["--token", self.token]
        return [*args, *self.extra_args]

    def start(self) -> UIServer:
        """Make the store if it is not there, start the child and wait until ``/healthz``
        answers 200."""
        self.directory.mkdir(parents=True, exist_ok=True)
        make_store(self.store_url)
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.directory,
                env=ui_env(self.store_url),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = "no answer yet"
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(
                    f"ai-lease ui exited with {self.process.returncode} before serving\n"
                    f"{self.tail()}"
                )
            try:
                reply = httpx.get(self.url("/healthz"), timeout=2.0)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if reply.status_code == 200:
                    return
                last = f"{reply.status_code} {reply.text[:200]!r}"
            time.sleep(_POLL_S)
        self.stop()
        raise AssertionError(
            f"ai-lease ui did not answer /healthz within {START_TIMEOUT_S:g}s ({last})\n"
            f"{self.tail()}"
        )

    def stop(self) -> int | None:
        """SIGINT, as Ctrl-C would; SIGKILL (and ``killed`` set) if it is still running after
        ``STOP_TIMEOUT_S``. Returns the exit code (None: never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def tail(self, chars: int = 4000) -> str:
        """The end of the child's output, for failure messages."""
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return f"--- ai-lease ui log ({self.log})\n{text[-chars:]}"

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
