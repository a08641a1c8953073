"""The peers' side of bench/peers.py: runs in the peers' own venv (``.venv-peers``: saq, arq,
pgqueuer and asyncpg from the package index), never in ai_lease's.

The worker side is each peer's own console script, pointed at this module (on PYTHONPATH):

    saq _peers_app.saq_settings                      # concurrency 32
    arq _peers_app.ArqSettings                       # max_jobs 32
    pgq run _peers_app:pgq_factory --max-concurrent-tasks 32

Every job is the same no-op function. The bench's side is a small command line:

    python bench/_peers_app.py enqueue saq|arq|pgqueuer PREFIX N   # N jobs, one call each
    python bench/_peers_app.py ends saq|arq|pgqueuer PREFIX N      # prints the last completion
                                                                   # (epoch s) and how many done

The Redis URL is ``PEERS_REDIS_URL``; the PostgreSQL DSN ``PGDSN``; concurrency
``PEERS_CONCURRENCY`` (default 32).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC
from typing import Any, ClassVar

CONCURRENCY = int(os.environ.get("PEERS_CONCURRENCY", "32"))
REDIS_URL = os.environ.get("PEERS_REDIS_URL", "redis://127.0.0.1:6379")
PG_DSN = os.environ.get("PGDSN", "")


async def noop(ctx: Any, **kwargs: Any) -> None:
    """The job: nothing (saq and arq pass a context first)."""


# --- saq ---------------------------------------------------------------------------------------
def _saq_queue() -> Any:
    from saq import Queue

    return Queue.from_url(REDIS_URL)


if os.environ.get("PEERS_SYSTEM") == "saq":
    saq_settings = {"queue": _saq_queue(), "functions": [noop], "concurrency": CONCURRENCY}


# --- arq ---------------------------------------------------------------------------------------
class ArqSettings:
    functions: ClassVar[list[Any]] = [noop]
    max_jobs = CONCURRENCY
    if os.environ.get("PEERS_SYSTEM") == "arq":
        from arq.connections import RedisSettings

        redis_settings = RedisSettings.from_dsn(REDIS_URL)


# --- pgqueuer ----------------------------------------------------------------------------------
@asynccontextmanager
async def pgq_factory() -> AsyncIterator[Any]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer

    conn = await asyncpg.connect(PG_DSN)
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def _noop(job: Any) -> None:
        """The job: nothing."""

    try:
        yield pgq
    finally:
        await conn.close()


# --- the bench's side --------------------------------------------------------------------------
async def enqueue(system: str, prefix: str, n: int) -> None:
    keys = [f"{prefix}-{i:05d}" for i in range(n)]
    if system == "saq":
        queue = _saq_queue()
        for key in keys:
            await queue.enqueue("noop", key=key)
        await queue.disconnect()
    elif system == "arq":
        from arq import create_pool
        from arq.connections import RedisSettings

        pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
        for key in keys:
            await pool.enqueue_job("noop", _job_id=key)
        await pool.aclose()
    else:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        conn = await asyncpg.connect(PG_DSN)
        queries = Queries(AsyncpgDriver(conn))
        for _ in keys:
            await queries.enqueue("noop", None)
        await conn.close()


async def ends(system: str, prefix: str, n: int) -> tuple[float, int]:
    """The last completion time (epoch seconds) among the run's jobs, and how many finished."""
    keys = [f"{prefix}-{i:05d}" for i in range(n)]
    if system == "saq":
        queue = _saq_queue()
        done = [job for job in [await queue.job(k) for k in keys] if job and job.completed]
        await queue.disconnect()
        return max(job.completed for job in done) / 1000, len(done)
    if system == "arq":
        from arq import create_pool
        from arq.connections import RedisSettings
        from arq.jobs import Job

        pool = await create_pool(RedisSettings.from_dsn(REDIS_URL))
        infos = [await Job(k, pool).result_info() for k in keys]
        await pool.aclose()
        done = [info for info in infos if info is not None and info.success]
        return max(info.finish_time.timestamp() for info in done), len(done)
    import asyncpg

    conn = await asyncpg.connect(PG_DSN)
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM max(created)) AS last, count(*) AS n FROM pgqueuer_log"
        " WHERE status = 'successful' AND entrypoint = 'noop' AND created >= $1::timestamptz",
        _since(),
    )
    await conn.close()
    return float(row["last"]), int(row["n"])


def _since() -> Any:
    from datetime import datetime

    return datetime.fromtimestamp(float(os.environ.get("PEERS_SINCE", "0")), UTC)


def main() -> int:
    verb, system, prefix, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if verb == "enqueue":
        asyncio.run(enqueue(system, prefix, n))
        return 0
    last, done = asyncio.run(ends(system, prefix, n))
    print(f"{last:.6f} {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
