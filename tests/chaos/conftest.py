"""Fixtures of the chaos scenarios; the ``chaos`` marker is registered here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.harness.chaos_cluster import ChaosCluster
from tests.harness.redis_server import RedisServer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: fault-injection scenarios")


@pytest.fixture
async def cluster(store_url: str, tmp_path: Path) -> AsyncIterator[ChaosCluster]:
    """Chaos node processes on the parametrized store (SQLite file or Redis database)."""
    async with ChaosCluster(store_url, tmp_path) as running:
        yield running


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to pause, restart or protect with a password."""
    with RedisServer() as server:
        yield server
