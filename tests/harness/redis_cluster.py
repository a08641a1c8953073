"""A real three-master Redis Cluster on loopback, for the Cluster tests.

Three ``redis-server --cluster-enabled yes`` processes (each in its own directory, via
:class:`RedisServer`), joined with ``redis-cli --cluster create``; ready when every node
reports ``cluster_state:ok``.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from types import TracebackType

from .redis_server import HOST, RedisServer

REAL_TIME = "it waits on real redis-server processes"


def _cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too, both below the kernel's
    ephemeral ports (32768 and up here): no socket picked by the system, of this run or
    another, takes one between this check and the node's start."""
    for _ in range(200):
        port = random.randint(10000, 22000)
        if all(_free(p) for p in (port, port + 10000)):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


__all__ = ["RedisCluster"]


class RedisCluster:
    """``with RedisCluster() as cluster: cluster.url``  ->  ``redis+cluster://127.0.0.1:P``"""

    def __init__(self, masters: int = 3) -> None:
        self.nodes = [
            RedisServer(
                port=_cluster_port(),
                extra_args=["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"],
            )
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://{HOST}:{self.nodes[0].port}/0"

    def start(self) -> RedisCluster:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli not found on PATH: cannot form a Redis Cluster")
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        out = subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
        self._wait_ok(cli)
        return self

    def _wait_ok(self, cli: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [
                subprocess.run(
                    [cli, "-p", str(node.port), "cluster", "info"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                for node in self.nodes
            ]
            if all("cluster_state:ok" in state for state in states):
                return
            time.sleep(0.2)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok within 30 s")

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisCluster:
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
