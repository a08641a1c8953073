"""A PostgreSQL cluster of our own (``initdb`` + ``pg_ctl``) that tests can kill, pause and restart.

Unlike the Redis harness, the data survives a restart or a SIGKILL (that is the point of a
database): ``kill()`` is the crash case, and the next ``start()`` runs crash recovery.

    with PostgresServer() as server:
        server.execute("SELECT 1")
        server.pause()    # postmaster and backends frozen; connects hang, nothing answers
        server.resume()
        server.kill()     # SIGKILL the whole server
        server.start()    # crash recovery, same port, same data

PostgreSQL refuses to run as root, and CI runs as root: then every server binary runs as
the unprivileged user ``ailease_pg`` (created when missing) through ``runuser -u … --``, and
the cluster's directory belongs to that user. Trust authentication, 127.0.0.1 only.

The harness itself uses only the standard library, except ``execute()`` which needs psycopg.
A missing binary is an error, never a skip.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.harness.redis_server import HOST, free_port

__all__ = ["PG_USER", "SUPERUSER", "PostgresServer", "pg_binary"]

PG_USER = "ailease_pg"  # the OS user running the server when we are root
SUPERUSER = "ailease"  # the database superuser initdb creates
DATABASE = "ailease_test"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_POLL_INTERVAL_S = 0.02
_HBA = (
    "local all all trust\n"
    "host all all 127.0.0.1/32 trust\n"
    "host replication all 127.0.0.1/32 trust\n"
)


def pg_binary(name: str) -> str:
    """Find a server binary on PATH or under /usr/lib/postgresql/*/bin (newest first)."""
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda path: int(Path(path).parent.parent.name or 0),
        reverse=True,
    )
    if candidates:
        return candidates[0]
    raise RuntimeError(
        f"{name} is neither on PATH nor under /usr/lib/postgresql/*/bin: install PostgreSQL "
        "(e.g. apt-get install postgresql) — PostgreSQL tests fail rather than skip without it"
    )


def _bin_dir() -> Path:
    """The directory of initdb, so every tool comes from the same installation."""
    return Path(os.path.realpath(pg_binary("initdb"))).parent


def ensure_pg_user() -> None:
    """Create the unprivileged user the server runs as under root, if it is missing."""
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", PG_USER], capture_output=True, text=True
        )
        # 9: made meanwhile by another process (two test runs starting at once)
        if made.returncode not in (0, 9):
            raise RuntimeError(
                f"useradd {PG_USER} exited {made.returncode}: {made.stderr}"
            ) from None


def _as_server_user(argv: Sequence[str]) -> list[str]:
    """``argv`` run as the unprivileged user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", PG_USER, "--", *argv]


def _proc_children(pid: int) -> list[int]:
    """Every process whose parent is ``pid`` (the postmaster's backends and workers)."""
    children = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            children.append(int(Path(stat).parent.name))
    return children


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _signal_all(pids: Sequence[int], signum: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory on a loopback port.

    ``fsync`` is off by default (speed; a SIGKILL loses nothing the OS already has); a
    test about durability across machines (failover) turns it on. ``settings`` become
    lines of postgresql.conf. ``primary``: make this cluster a streaming standby of that
    one with ``pg_basebackup -R`` instead of ``initdb``.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        fsync: bool = False,
        settings: Mapping[str, str] | None = None,
        primary: PostgresServer | None = None,
    ) -> None:
        self._port = port
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.primary = primary
        self._tmpdir: Path | None = None
        self._pid: int | None = None
        self._paused: list[int] = []
        self._thaw: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        return f"PostgresServer(port={self._port}, {state})"

    # -- addresses -------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("PostgresServer has no port yet: call start() first")
        return self._port

    @property
    def database(self) -> str:
        return DATABASE

    @property
    def url(self) -> str:
        return f"postgresql://{SUPERUSER}@{HOST}:{self.port}/{DATABASE}"

    @property
    def data_dir(self) -> Path:
        if self._tmpdir is None:
            raise RuntimeError("PostgresServer has no cluster yet: call start() first")
        return self._tmpdir / "data"

    @property
    def log_path(self) -> Path | None:
        return None if self._tmpdir is None else self._tmpdir / "postgres.log"

    @property
    def pid(self) -> int:
        """The postmaster's pid."""
        if self._pid is None:
            raise RuntimeError(f"{self!r} is not running: call start() first")
        return self._pid

    @property
    def running(self) -> bool:
        return self._pid is not None and _alive(self._pid)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Create the cluster on first use, start it and wait until it accepts queries."""
        if self.running:
            raise RuntimeError(f"{self!r} is already running")
        first = self._tmpdir is None
        if first:
            self._create()
        self._pg_ctl("start", "-w", "-t", str(int(START_TIMEOUT_S)), "-l", str(self.log_path))
        self._pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        if first and self.primary is None:
            self.execute(f'CREATE DATABASE "{DATABASE}"', dbname="postgres")
        return self

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (smart / fast / immediate); a no-op when not running."""
        if not self.running:
            self._pid = None
            return
        self.resume()
        self._pg_ctl("stop", "-w", "-m", mode, "-t", str(int(STOP_TIMEOUT_S)))
        self._pid = None

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: the crash case, nothing shuts down."""
        if self._pid is None:
            return
        pids = [self._pid, *_proc_children(self._pid)]
        _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while any(_alive(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self!r}: processes {pids} survived SIGKILL")
            time.sleep(_POLL_INTERVAL_S)
        # Until init reaps the dead postmaster (seconds, here) its zombie's pid looks alive
        # to the next postmaster, which would refuse to start: the lock files go now.
        assert self._tmpdir is not None
        for lock in (self.data_dir / "postmaster.pid", self._tmpdir / f".s.PGSQL.{self.port}.lock"):
            lock.unlink(missing_ok=True)
        self._pid = None
        self._paused = []

    def pause(self, for_s: float | None = None) -> None:
        """SIGSTOP the postmaster and its backends: connects hang, no query is answered.

        With ``for_s`` a child process sends the SIGCONT after that long, so the pause
        ends even when this process is stuck (a call blocking the interpreter)."""
        if not self.running:
            raise RuntimeError(f"cannot pause {self!r}")
        # The postmaster first, so it forks no new backend while we collect its children.
        _signal_all([self.pid], signal.SIGSTOP)
        self._paused = [self.pid, *_proc_children(self.pid)]
        _signal_all(self._paused[1:], signal.SIGSTOP)
        if for_s is not None:
            script = 'sleep "$0"; kill -CONT "$@"'
            pids = [str(pid) for pid in self._paused]
            self._thaw = subprocess.Popen(["sh", "-c", script, str(for_s), *pids])

    def resume(self) -> None:
        """SIGCONT whatever ``pause()`` stopped; a no-op when nothing is paused."""
        _signal_all(self._paused, signal.SIGCONT)
        self._paused = []
        if self._thaw is not None:
            self._thaw.kill()
            self._thaw.wait()
            self._thaw = None

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode`` as in ``stop``, or ``"kill"`` for SIGKILL) and start again."""
        if mode == "kill":
            self.kill()
        else:
            self.stop(mode)
        self.start()

    def promote(self) -> None:
        """``pg_ctl promote``: a standby becomes a primary that accepts writes."""
        self._pg_ctl("promote", "-w", "-t", str(int(START_TIMEOUT_S)))

    def close(self) -> None:
        """Kill the server and remove its directory. Idempotent."""
        try:
            self.resume()
            self.kill()
        finally:
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log."""
        path = self.log_path
        if path is None or not path.exists():
            return "(no log written)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> PostgresServer:
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

    # -- SQL helpers -------------------------------------------------------------

    def execute(
        self, query: str, params: Sequence[Any] = (), *, dbname: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit on a fresh connection; its rows ([] if none)."""
        import psycopg

        with psycopg.connect(
            host=HOST,
            port=self.port,
            user=SUPERUSER,
            dbname=dbname or DATABASE,
            autocommit=True,
            connect_timeout=10,
        ) as conn:
            cursor = conn.execute(query, params or None)
            return cursor.fetchall() if cursor.description is not None else []

    def reset(self, namespace: str = "ai_lease") -> None:
        """DROP SCHEMA … CASCADE: the store's namespace is gone (Redis' FLUSHALL)."""
        quoted = namespace.replace('"', '""')
        self.execute(f'DROP SCHEMA IF EXISTS "{quoted}" CASCADE')

    def reset_all(self) -> None:
        """Drop every schema but the system ones and ``public``: a store of any namespace."""
        self.execute(
            "DO $$ DECLARE s name; BEGIN FOR s IN SELECT nspname FROM pg_namespace"
            " WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('public', 'information_schema')"
            " LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END $$"
        )

    def terminate_backends(self) -> int:
        """pg_terminate_backend() for every other client connection; how many were hit."""
        rows = self.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        return int(rows[0][0])

    # -- internals -------------------------------------------------------------

    def _create(self) -> None:
        """initdb (or pg_basebackup from the primary) into a fresh temporary directory."""
        if self._port is None:
            self._port = free_port()
        self._tmpdir = Path(tempfile.mkdtemp(prefix="ai_lease-pg-"))
        if os.geteuid() == 0:
            ensure_pg_user()
            shutil.chown(self._tmpdir, PG_USER, PG_USER)
        if self.primary is None:
            self._run(
                "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                "-E", "UTF8", "--locale=C", "--no-sync",
            )  # fmt: skip
            (self.data_dir / "pg_hba.conf").write_text(_HBA)
        else:
            self._run(
                "pg_basebackup", "-D", str(self.data_dir), "-R", "-X", "stream", "-c", "fast",
                "-h", HOST, "-p", str(self.primary.port), "-U", SUPERUSER, "--no-sync",
            )  # fmt: skip
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write(self._conf())

    def _conf(self) -> str:
        lines = {
            "port": str(self.port),
            "listen_addresses": f"'{HOST}'",
            "unix_socket_directories": f"'{self._tmpdir}'",
            "fsync": "on" if self.fsync else "off",
            "max_connections": "200",
            **self.settings,
        }
        return "\n# ai_lease test harness\n" + "".join(f"{k} = {v}\n" for k, v in lines.items())

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), *args)

    def _run(self, tool: str, *args: str) -> None:
        argv = _as_server_user([str(_bin_dir() / tool), *args])
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd="/", check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} exited with code {done.returncode}:\n"
                f"{done.stdout}{done.stderr}\nserver log tail:\n{self.log_tail()}"
            )
