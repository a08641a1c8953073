"""A primary and a synchronous streaming standby, both our own clusters, for failover tests.

    with SyncPair() as pair:
        pair.primary.execute("INSERT …")   # acknowledged only once the standby has it
        pair.fail_over()                   # SIGKILL the primary, promote the standby
        pair.standby.execute("SELECT …")   # the acknowledged row is there

``synchronous_commit = on`` with ``synchronous_standby_names = '*'`` (set once the standby
streams): a COMMIT returns only
after the standby has flushed its WAL, which is what makes an acknowledged result survive
the primary's loss. fsync stays on in both clusters (a durability test must not cheat).
"""

from __future__ import annotations

import time
from types import TracebackType

from tests.harness.pg_server import PostgresServer

REAL_TIME = "it waits on real PostgreSQL server processes"


__all__ = ["PRIMARY_SETTINGS", "SyncPair"]

PRIMARY_SETTINGS = {
    "wal_level": "replica",
    "synchronous_commit": "on",
    "max_wal_senders": "5",
    "wal_keep_size": "'64MB'",
}
SYNC_TIMEOUT_S = 30.0


class SyncPair:
    """``primary`` and ``standby`` (a ``pg_basebackup -R`` of it), the standby synchronous."""

    def __init__(self) -> None:
        self.primary = PostgresServer(fsync=True, settings=PRIMARY_SETTINGS)
        self.standby = PostgresServer(
            fsync=True, settings={"hot_standby": "on"}, primary=self.primary
        )

    def start(self) -> SyncPair:
        """Start the primary, clone and start the standby, wait until it streams in sync."""
        self.primary.start()
        self.standby.start()
        # Only now: with no standby yet, every commit (CREATE DATABASE too) would wait for one.
        self.primary.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        self.primary.execute("SELECT pg_reload_conf()")
        self.wait_in_sync()
        return self

    def wait_in_sync(self) -> None:
        """Block until the primary reports the standby as a synchronous, streaming replica."""
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while True:
            rows = self.primary.execute("SELECT state, sync_state FROM pg_stat_replication")
            if ("streaming", "sync") in rows:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"standby not in sync after {SYNC_TIMEOUT_S:.0f} s: {rows}\n"
                    f"standby log:\n{self.standby.log_tail()}"
                )
            time.sleep(0.05)

    def fail_over(self) -> None:
        """The primary crashes (SIGKILL, nothing flushed on its way out); the standby is
        promoted and accepts writes."""
        self.primary.kill()
        self.standby.promote()

    def close(self) -> None:
        try:
            self.standby.close()
        finally:
            self.primary.close()

    def __enter__(self) -> SyncPair:
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
