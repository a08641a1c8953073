"""`ai-lease worker --log-json` writes nothing but JSON lines on stderr: not when PostgreSQL
goes away under it (psycopg-pool's multi-line reconnect messages), not when Ctrl-C reaches
a worker with process isolation and its children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from tests.harness.pg_server import PostgresServer

REAL_TIME = "the worker is a subprocess; PostgreSQL is stopped and started under it"


STARTUP_S = 60.0  # generous: two CPUs shared with other test runs


class CliWorker:
    """``ai-lease worker --log-json …`` in its own process group, stderr read line by line."""

    def __init__(
        self, store_url: str, *args: str, cwd: Path, extra: dict[str, str] | None = None
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
        env |= extra or {}
        argv = [sys.executable, "-m", "ai_lease", "--store", store_url, "worker", "--log-json"]
        self.proc = subprocess.Popen(
            [*argv, "--sweep-interval", "0.1", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C reaches this group, as a terminal's does
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def wait_for(self, found: Callable[[str], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(found(line) for line in list(self.lines)):
            assert self.proc.poll() is None, f"worker exited before {what}: {self.lines}"
            assert time.monotonic() < deadline, f"no {what} in {timeout}s: {self.lines}"
            time.sleep(0.1)

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> int:
        os.killpg(self.proc.pid, signum)
        code = self.proc.wait(60)
        self._reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code

    def records(self) -> list[dict[str, object]]:
        """Every stderr line as JSON (a line that is not fails the test, naming it)."""
        parsed = []
        for line in self.lines:
            try:
                parsed.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                pytest.fail(f"stderr line is not JSON: {line!r}\nall lines: {self.lines}")
        return parsed


def submit_detached(cwd: Path, extra: dict[str, str], job_file: str = "job.toml") -> str:
    """``ai-lease submit JOB_FILE --detach`` into a fresh SQLite store in ``cwd``, with the
    test's environment (no ambient ``AI_LEASE_*`` / ``OPENAI*``) plus ``extra``; its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    url = f"sqlite:///{cwd / 's.db'}"
    submitted = subprocess.run(
        [sys.executable, "-m", "ai_lease", "--store", url, "submit", job_file, "--detach"],
        cwd=cwd, env=env | extra, capture_output=True,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    return url


def _started(line: str) -> bool:
    return '"worker_started"' in line


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """A cluster of this module's own: the test stops and starts it."""
    with PostgresServer() as server:
        yield server


@pytest.mark.postgres
def test_postgres_stopped_and_started_under_a_worker_logs_json_only(
    pg: PostgresServer, tmp_path: Path
) -> None:
    """PostgreSQL stopped for 4 s and started again under `worker --log-json`: every
    stderr line parses as JSON, psycopg-pool's reconnect messages included."""
    worker = CliWorker(pg.url, cwd=tmp_path)
    try:
        worker.wait_for(_started, "worker_started", STARTUP_S)
        time.sleep(2.0)  # the pool fills in the background: its connections are open
        pg.stop()
        time.sleep(4.0)  # the outage: the worker's sweeps and the pool's reconnects fail
        pg.start()
        time.sleep(3.0)  # the pool reconnects
    finally:
        if not pg.running:
            pg.start()
        worker.stop()
    records = worker.records()
    loggers = {str(r.get("logger")) for r in records}
    assert any(name.startswith("psycopg") for name in loggers), worker.lines  # the fault showed


@pytest.mark.slow
def test_ctrl_c_to_a_process_isolation_worker_logs_json_only(tmp_path: Path) -> None:
    """SIGINT to the process group of `worker --isolation process --log-json` (a Ctrl-C):
    the worker drains and exits 0, every stderr line is JSON, no child prints a traceback."""
    worker = CliWorker(f"sqlite:///{tmp_path / 's.db'}", "--isolation", "process", cwd=tmp_path)
    try:
        worker.wait_for(_started, "worker_started", STARTUP_S)
        time.sleep(1.0)  # the children have started
    finally:
        code = worker.stop(signal.SIGINT)
    records = worker.records()
    assert code == 0, worker.lines
    assert not any("Traceback" in line or "KeyboardInterrupt" in line for line in worker.lines)
    assert any(r.get("event") == "worker_stopped" for r in records), worker.lines


CHATTY = """
import logging
from ai_lease.providers.base import Completion, Delta

class ChattyProvider:
    name = "chatty"
    async def stream(self, request):
        logging.getLogger("chatty_sdk").warning("retrying:\\n\\tthe SDK's second line")
        yield Delta(text="fine")
        yield Delta(finish_reason="stop")
    async def complete(self, request):
        logging.getLogger("chatty_sdk").warning("retrying:\\n\\tthe SDK's second line")
        return Completion(text="fine", finish_reason="stop")
    async def aclose(self):
        pass

def make(**options):
    return ChattyProvider()
"""


@pytest.mark.slow
def test_a_library_logging_in_a_process_isolation_child_logs_json(tmp_path: Path) -> None:
    """A provider's library logging a multi-line warning inside the job's child process
    (`worker --isolation process --log-json`): that record is one JSON line too."""
    plugins = tmp_path / "plugins"
    dist = plugins / "chatty_llm-1.0.dist-info"
    dist.mkdir(parents=True)
    (plugins / "chatty_llm.py").write_text(CHATTY)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: chatty-llm\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nchatty = chatty_llm:make\n")
    (tmp_path / "in.txt").write_text("some input")
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "in.txt"\n'
    )
    extra = {"PYTHONPATH": str(plugins), "AI_LEASE_PROVIDER__NAME": "chatty"}
    url = f"sqlite:///{tmp_path / 's.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    submitted = subprocess.run(
        [sys.executable, "-m", "ai_lease", "--store", url, "submit", "job.toml", "--detach"],
        cwd=tmp_path, env=env | extra, capture_output=True,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    worker = CliWorker(url, "--isolation", "process", cwd=tmp_path, extra=extra)
    try:
        worker.wait_for(lambda line: '"committed"' in line, "the job's commit", STARTUP_S)
    finally:
        worker.stop()
    records = worker.records()
    said = [r for r in records if r.get("logger") == "chatty_sdk"]
    assert said and said[0]["detail"] == "retrying:\n\tthe SDK's second line", worker.lines
