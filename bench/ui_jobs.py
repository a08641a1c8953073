"""The dashboard's jobs page with 10,000 jobs in the store, on SQLite and on Redis.

    .venv/bin/python bench/ui_jobs.py                 # 10,000 jobs, 20 requests each
    .venv/bin/python bench/ui_jobs.py --jobs 100000 --reps 10

The real app (``ai_lease.ui.app.create_app``) on a real uvicorn on a loopback port, over a
store filled through the store's own write paths (bench/list_jobs.py's fillers: one job in
ten RUNNING). Timed per request, from the client (httpx, keep-alive): ``GET /jobs`` (the
newest page of 50 rows), ``GET /jobs?status=RUNNING``, ``GET /jobs?prefix=…``, and a deep page
(``after=`` the cursor of the first page's next link). Medians and the worst, in ms; the
target (issue 16): the jobs page renders in under 300 ms on both stores.

The live-update cost is counted, not timed: a counting wrapper over the store tallies its
reads while one page's event stream is open for ``--stream-s`` seconds at ``--refresh``,
as jobs change underneath; the target is at most one store read per refresh interval.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness
sys.path.insert(0, str(Path(__file__).resolve().parent))  # for list_jobs (beside this file)

import list_jobs

from ai_lease.client import Client
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.ui.app import create_app
from tests.harness.redis_server import RedisServer

TARGET_MS = 300.0


class CountingStore:
    """The store, its page reads counted (everything else passed through)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.reads = inner, 0

    async def list_page(self, **kwargs: Any) -> Any:
        self.reads += 1
        return await self.inner.list_page(**kwargs)

    async def list_jobs(self, **kwargs: Any) -> Any:
        self.reads += 1
        return await self.inner.list_jobs(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@asynccontextmanager
async def serving(store: Any, refresh: float) -> AsyncIterator[str]:
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP
    # (as uvicorn's own listening socket does); without it Nagle adds ~40 ms per response
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    app = create_app(Client(store), settings_view={"store": "bench"}, refresh=refresh)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:  # noqa: ASYNC110  (uvicorn says so by a flag, not an event)
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


async def timed(client: httpx.AsyncClient, url: str, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        started = time.perf_counter()
        response = await client.get(url)
        out.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        assert response.text.count('<tr class="job"') >= 1, url
    return out


async def stream_reads(
    client: httpx.AsyncClient, store: CountingStore, seconds: float, refresh: float
) -> tuple[int, float]:
    """Store reads while one page's event stream is open and jobs change; and the
    intervals that passed."""
    before = store.reads
    started = time.perf_counter()

    async def read() -> None:
        async with client.stream("GET", "/jobs/stream") as response:
            async for _ in response.aiter_bytes():
                pass

    reader = asyncio.create_task(read())
    n = 0
    while time.perf_counter() - started < seconds:
        await store.inner.submit(f"live-{n:05d}", "{}", "fp")  # jobs change underneath
        n += 1
        await asyncio.sleep(refresh / 4)
    reader.cancel()
    elapsed = time.perf_counter() - started
    return store.reads - before, elapsed / refresh


async def measure(store: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    counted = CountingStore(store)
    async with (
        serving(counted, args.refresh) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as client,
    ):
        first = (await client.get("/jobs")).text  # warm-up (and Redis's one-time backfill)
        match = re.search(
            r'id="next-page"[^>]*href="([^"]+)"|href="([^"]+)"[^>]*id="next-page"', first
        )
        deep = (match.group(1) or match.group(2)).replace("&amp;", "&") if match else "/jobs"
        rows = {
            "jobs": await timed(client, "/jobs", args.reps),
            "status": await timed(client, "/jobs?status=RUNNING", args.reps),
            "prefix": await timed(client, "/jobs?prefix=bench-0001", args.reps),
            "next page": await timed(client, deep, args.reps),
        }
        reads, intervals = await stream_reads(client, counted, args.stream_s, args.refresh)
    return {"rows": rows, "reads": reads, "intervals": intervals, "name": name}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="ai-lease-ui-bench-") as tmp:
        async with SQLiteStore(Path(tmp) / "jobs.db") as sqlite:
            await list_jobs.fill_sqlite(sqlite, args.jobs)
            results.append(await measure(sqlite, "sqlite", args))
        with RedisServer() as server:
            async with RedisStore.from_url(server.url, namespace="bench") as redis:
                await list_jobs.fill_redis(redis, args.jobs)
                results.append(await measure(redis, "redis", args))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--refresh", type=float, default=0.5)
    parser.add_argument("--stream-s", type=float, default=5.0)
    args = parser.parse_args()
    print(
        f"ui_jobs: {args.jobs} jobs, {args.reps} requests per page; Python {sys.version.split()[0]}"
    )
    print(f"{'store':<7} {'page':<10} {'median ms':>10} {'max ms':>8}")
    verdicts = []
    for result in asyncio.run(run(args)):
        name = result["name"]
        for page, took in result["rows"].items():
            median = statistics.median(took)
            print(f"{name:<7} {page:<10} {median:>10.1f} {max(took):>8.1f}")
            verdicts.append((median < TARGET_MS, f"{name} {page} {median:.1f} ms < {TARGET_MS:g}"))
        reads, intervals = result["reads"], result["intervals"]
        print(f"{name:<7} live: {reads} store reads in {intervals:.1f} refresh intervals")
        # one read when the stream opens, then at most one per interval
        ok = reads <= intervals + 1
        verdicts.append((ok, f"{name} live {reads} reads <= 1 + {intervals:.1f} intervals"))
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
