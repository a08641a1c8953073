"""A real ``redis-server`` child process that tests can kill, pause and restart.

Persistence is off, so a restart (or a kill followed by start) loses every key —
exactly what a crashed, non-persistent Redis does to a lease store.

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        server.pause()    # the process is frozen; connects succeed, replies never come
        server.resume()
        server.restart()  # same port, empty dataset

Dependency-free on purpose (subprocess, socket, signal): the harness must work
even when the code under test, or redis-py itself, is what is broken.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["RedisServer", "free_port"]

HOST = "127.0.0.1"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
_POLL_INTERVAL_S = 0.02
_LOG_NAMES = ("redis.log", "redis.out")


class _PortTaken(RuntimeError):
    """redis-server could not bind its port (someone took it after free_port())."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _encode(*args: str) -> bytes:
    """Encode one command as a RESP array of bulk strings."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


def _read_reply(sock: socket.socket) -> bytes:
    """Read one simple (``+OK``, ``-ERR ..``) or bulk reply; bulk comes back unframed."""
    buf = b""
    while b"\r\n" not in buf or (buf.startswith(b"$") and not _bulk_complete(buf)):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"redis closed the connection after {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n")
    return rest[: int(head[1:])] if head.startswith(b"$") else head


def _bulk_complete(buf: bytes) -> bool:
    head, _, rest = buf.partition(b"\r\n")
    return int(head[1:]) < 0 or len(rest) >= int(head[1:]) + 2


class RedisServer:
    """One ``redis-server`` on a loopback port, with signals for fault injection.

    The port is fixed at the first ``start()`` and kept across ``restart()``,
    so clients configured with ``url`` reconnect to the fresh process.

        with RedisServer(password="s3cret") as server:
            redis.Redis.from_url(server.url).ping()
    """

    def __init__(
        self,
        port: int | None = None,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._port = port
        # A port we picked ourselves may be grabbed by someone else before redis
        # binds it; only then is retrying on another port harmless.
        self._may_repick_port = port is None
        self.password = password
        self.extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._tmpdir: Path | None = None
        self._log_sizes: dict[str, int] = {}  # where this process's output starts
        self._paused = False

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        return f"RedisServer(port={self._port}, {state})"

    # -- addresses -------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("RedisServer has no port yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("RedisServer is not running: call start() first")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path | None:
        return None if self._tmpdir is None else self._tmpdir / "redis.log"

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> RedisServer:
        """Launch the process and block until it answers (at most 10 s), then return self."""
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not on PATH: install Redis (e.g. apt-get install "
                "redis-server) — Redis-backed tests fail rather than skip without it"
            )
        if self._tmpdir is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="ai_lease-redis-"))
        for attempt in range(3):
            if self._port is None or (self._may_repick_port and attempt > 0):
                self._port = free_port()
            self._spawn(binary)
            try:
                self._wait_until_ready()
            except _PortTaken:
                if not self._may_repick_port or attempt == 2:
                    raise
                continue
            self._may_repick_port = False
            return self
        raise AssertionError("unreachable")

    def kill(self) -> None:
        """SIGKILL the process and reap it: the crash case, nothing is flushed."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        self._process = None
        self._paused = False

    def stop(self) -> None:
        """SIGTERM the process and reap it, falling back to SIGKILL after 5 s."""
        process = self._process
        if process is None:
            return
        if self._paused:
            self.resume()  # a stopped process would not act on SIGTERM until SIGCONT
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def pause(self) -> None:
        """SIGSTOP: the kernel still accepts connections, but nothing is answered."""
        self._signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT: undo ``pause()``; queued commands are then served."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> None:
        """Kill and start again on the same port; the dataset is gone."""
        self.kill()
        self.start()

    def flushall(self) -> None:
        """Delete every key, over a raw socket (no redis-py involved)."""
        reply = self._call("FLUSHALL")
        if reply != b"+OK":
            raise RuntimeError(f"FLUSHALL on {self!r} failed: {reply!r}")

    def close(self) -> None:
        """Resume if paused, kill, and remove the temporary directory. Idempotent."""
        try:
            if self._paused and self.running:
                self.resume()
            self.kill()
        finally:
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def log_tail(self, lines: int = 20, *, since_spawn: bool = False) -> str:
        """The last ``lines`` lines of the server's log and stdout/stderr.

        With ``since_spawn`` only what the current (or last) process wrote.
        """
        if self._tmpdir is None:
            return "(no log written)"
        tails = []
        for name in _LOG_NAMES:
            text = self._read_log(name, since_spawn)
            if text:
                tails.append(f"--- {name}\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails) or "(no log written)"

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------

    def _command(self, binary: str) -> list[str]:
        assert self._tmpdir is not None
        command = [
            binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self._tmpdir),
            "--logfile", str(self._tmpdir / "redis.log"),
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        return command + list(self.extra_args)

    def _spawn(self, binary: str) -> None:
        assert self._tmpdir is not None
        # Config errors go to stderr before the logfile is open; keep them for log_tail().
        logs = [self._tmpdir / name for name in _LOG_NAMES]
        self._log_sizes = {log.name: log.stat().st_size if log.exists() else 0 for log in logs}
        with open(self._tmpdir / "redis.out", "ab") as out:
            self._process = subprocess.Popen(
                self._command(binary), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self._paused = False

    def _signal(self, signum: signal.Signals) -> None:
        if not self.running:
            raise RuntimeError(f"cannot send {signum.name} to {self!r}")
        os.kill(self.pid, signum)

    def _read_log(self, name: str, since_spawn: bool) -> str:
        assert self._tmpdir is not None
        path = self._tmpdir / name
        if not path.exists():
            return ""
        with open(path, "rb") as log:
            log.seek(self._log_sizes.get(name, 0) if since_spawn else 0)
            return log.read().decode(errors="replace").strip()

    def _wait_until_ready(self) -> None:
        try:
            self._poll_until_ready()
        except BaseException:
            self.kill()
            raise

    def _poll_until_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.running:
                code = self._process.returncode if self._process else None
                tail = self.log_tail(since_spawn=True)
                error = _PortTaken if "Address already in use" in tail else RuntimeError
                raise error(
                    f"redis-server on port {self.port} exited with code {code} during "
                    f"startup; log tail:\n{tail}"
                )
            try:
                # Asking for the pid, not just PING, proves it is *our* process answering.
                info = self._call("INFO", "server", timeout_s=0.5)
                if f"process_id:{self.pid}\r\n".encode() in info:
                    return
            except OSError as exc:
                last_error = exc
            time.sleep(_POLL_INTERVAL_S)
        raise RuntimeError(
            f"redis-server on port {self.port} did not answer within {START_TIMEOUT_S:.0f} s "
            f"(last error: {last_error!r}); log tail:\n{self.log_tail(since_spawn=True)}"
        )

    def _call(self, *command: str, timeout_s: float = 5.0) -> bytes:
        """Send one command (after AUTH when needed) and return its reply."""
        with socket.create_connection((HOST, self.port), timeout=timeout_s) as sock:
            if self.password:
                sock.sendall(_encode("AUTH", self.password))
                reply = _read_reply(sock)
                if reply != b"+OK":
                    raise RuntimeError(f"AUTH on {self!r} failed: {reply!r}")
            sock.sendall(_encode(*command))
            return _read_reply(sock)
