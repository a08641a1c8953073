"""Listing jobs for the dashboard: ``list_page`` against the old ``list_jobs``, on SQLite and Redis.

For each store and job count (default 10,000 and 100,000) the store is filled through its own
write paths in bulk (SQLite: the store's ``submit``/``acquire`` rules and record writer, 5,000
jobs per transaction; Redis: the store's ``SUBMIT``/``ACQUIRE`` scripts, pipelined), one job in
ten RUNNING, the rest PENDING. Then, each timed ``--reps`` times (medians, milliseconds):

* ``first``     ``list_page(limit=50)``: the newest page
* ``deep``      ``list_page(limit=50, after=<the cursor at the middle job>)``
* ``status``    ``list_page(status="RUNNING", limit=50)`` (one job in ten matches)
* ``prefix``    ``list_page(prefix=<a prefix 100 keys share>, limit=50)``
* ``prefix50``  following that prefix's cursors until 50 jobs (one call when the first page
  holds them)
* ``counts``    ``count_jobs()``
* ``list_jobs`` the old ``list_jobs(limit=50)`` (Redis: a SCAN of the namespace)

Target (issue 16): the jobs page with 10,000 jobs renders in under 300 ms; the store's part
of a page (``first`` + ``counts``) is judged against it. Redis's one-time backfill of jobs
from before its index runs before the timing (a warm-up call).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.harness

from ai_lease.lease import rules
from ai_lease.lease.listing import created_us, encode_cursor
from ai_lease.stores.redis.keys import us
from ai_lease.stores.redis.store import RedisStore
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.redis_server import RedisServer

BATCH = 5000
ACQUIRE: dict[str, Any] = dict(
    ttl=3600, max_no_progress=600, stall_policy="expire", fingerprint=None, max_attempts=None
)
OPS = ("first", "deep", "status", "prefix", "prefix50", "counts", "list_jobs")


def _key(n: int) -> str:
    return f"bench-{n:06d}"


def _running(n: int) -> bool:
    return n % 10 == 0


async def fill_sqlite(store: SQLiteStore, count: int) -> None:
    """``count`` jobs through the store's rules and record writer, BATCH per transaction."""
    for start in range(0, count, BATCH):

        def work(conn: Any, start: int = start) -> None:
            for n in range(start, min(count, start + BATCH)):
                now = time.time()
                if _running(n):
                    new, _ = rules.acquire(None, _key(n), "bench#1", now, **ACQUIRE)
                else:
                    new, _ = rules.submit(None, _key(n), now, spec="{}", fingerprint="fp")
                assert new is not None
                store._save(conn, new)

        await store._write("bench", work)


async def fill_redis(store: RedisStore, count: int) -> None:
    """``count`` jobs through the store's SUBMIT and ACQUIRE scripts, pipelined."""
    await store.count_jobs()  # loads the scripts, marks the (empty) index backfilled
    acquire = [
        *("bench#1", us(3600), us(600), "expire"),
        *("", "", "", ""),
    ]
    for start in range(0, count, BATCH):
        pipe = store._client.pipeline(transaction=False)
        for n in range(start, min(count, start + BATCH)):
            key = _key(n)
            name = "ACQUIRE" if _running(n) else "SUBMIT"
            keys = store._script_keys(key, name)
            args = acquire if _running(n) else ["{}", "fp", key]
            pipe.execute_command("EVALSHA", store._scripts[name].sha, len(keys), *keys, *args)
        await pipe.execute()


async def _median_ms(call: Callable[[], Awaitable[Any]], reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def walk(store: Any, prefix: str, want: int = 50) -> int:
    """Follow a prefix's pages until ``want`` jobs (or the end): how many calls it took."""
    found, after, calls = 0, None, 0
    while found < want:
        page = await store.list_page(prefix=prefix, limit=want - found, after=after)
        found, after, calls = found + len(page.jobs), page.next_cursor, calls + 1
        if after is None:
            break
    return calls


async def measure(store: Any, count: int, reps: int) -> dict[str, float]:
    """The medians of each listing call on a filled store (ms)."""
    await store.list_page(limit=1)  # warm-up (Redis: the index backfill check)
    middle = await store.get(_key(count // 2))
    deep = encode_cursor(created_us(middle.created_at), middle.key)
    prefix = _key(count // 2)[:-2]  # 100 keys share it
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "first": lambda: store.list_page(limit=50),
        "deep": lambda: store.list_page(limit=50, after=deep),
        "status": lambda: store.list_page(status="RUNNING", limit=50),
        "prefix": lambda: store.list_page(prefix=prefix, limit=50),
        "prefix50": lambda: walk(store, prefix),
        "counts": store.count_jobs,
        "list_jobs": lambda: store.list_jobs(limit=50),
    }
    assert len((await calls["first"]()).jobs) == 50
    assert len((await calls["status"]()).jobs) == 50
    got: dict[str, float] = {"prefix_jobs": len((await calls["prefix"]()).jobs)}
    got["prefix_calls"] = await walk(store, prefix)
    for name, call in calls.items():
        got[name] = await _median_ms(call, max(3, reps // 4) if name == "list_jobs" else reps)
    return got


async def run(args: argparse.Namespace, url: str, tmp: str) -> dict[tuple[str, int], Any]:
    results: dict[tuple[str, int], Any] = {}
    for count in args.jobs:
        for kind in args.stores:
            t0 = time.perf_counter()
            if kind == "sqlite":
                store: Any = SQLiteStore(Path(tmp) / f"list-{count}.db")
                await fill_sqlite(store, count)
            else:
                store = RedisStore.from_url(url, namespace=f"bench{count}")
                await fill_redis(store, count)
            fill_s = time.perf_counter() - t0
            try:
                results[(kind, count)] = (fill_s, await measure(store, count, args.reps))
            finally:
                await store.aclose()
    return results


def report(results: dict[tuple[str, int], Any]) -> None:
    print(f"\n{'store':8} {'jobs':>8} {'fill s':>7} " + " ".join(f"{op:>9}" for op in OPS))
    for (kind, count), (fill_s, got) in results.items():
        cells = " ".join(f"{got[op]:9.2f}" for op in OPS)
        print(f"{kind:8} {count:8d} {fill_s:7.1f} {cells}")
    print("(medians, ms; 100 keys match the prefix, half-way down the index)")
    for (kind, count), (_, got) in results.items():
        held, calls = got["prefix_jobs"], got["prefix_calls"]
        print(f"  {kind} {count}: prefix's first page {held:.0f} jobs; 50 in {calls:.0f} calls")
    for (kind, count), (_, got) in results.items():
        for op in OPS:
            print(f"RESULT {kind}_{count}_{op}_ms {got[op]:.2f}")
    for (kind, count), (_, got) in results.items():
        if count != 10_000:
            continue
        page = got["first"] + got["counts"]
        verdict = "ok" if page < 300 else "miss"
        print(f"VERDICT {verdict} {kind}: a page's store reads at 10,000 jobs {page:.1f} ms < 300")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--jobs", type=lambda s: [int(n) for n in s.split(",")], default=[10_000, 100_000]
    )
    p.add_argument("--stores", type=lambda s: s.split(","), default=["sqlite", "redis"])
    p.add_argument("--reps", type=int, default=21, help="timed calls per operation (median)")
    args = p.parse_args()
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="ai_lease-bench-") as tmp:
        report(asyncio.run(run(args, server.url, tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
