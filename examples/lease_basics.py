"""The lease core on the embedded store, in one run: own, follow, stall, take over, fence.

The store's own operations, below the front door (see ``front_door.py`` for the client).

    python examples/lease_basics.py [STORE_URL]

Uses ``sqlite:///.ai-lease/examples.db`` by default (no server needed); pass a
``redis://`` URL to run it on Redis. Times are compressed: TTL 1.5 s, budget 0.5 s.
"""

from __future__ import annotations

import asyncio
import sys
import time

import ai_lease
from ai_lease import Acquired, FencingRejected, Following

TTL, BUDGET, GRACE = 1.5, 0.5, 0.25


async def main(url: str) -> None:
    key = f"example-{time.time_ns()}"
    async with ai_lease.connect(url) as client:  # closes the store on the way out
        store = client.store
        a = await store.acquire(key, "node-a", ttl=TTL, max_no_progress=BUDGET)
        b = await store.acquire(key, "node-b", ttl=TTL, max_no_progress=BUDGET)
        assert isinstance(a, Acquired) and isinstance(b, Following)
        print(f"node-a owns {key} with token {a.fence.token}; node-b follows node-a")

        renewal = await store.renew(
            a.fence, ttl=TTL, stage="load", progress_version=1, max_no_progress=BUDGET, grace=GRACE
        )
        print(f"node-a made progress and renewed: ok={renewal.ok}")

        await asyncio.sleep(BUDGET + GRACE + 0.2)  # node-a's business hangs; its heartbeat does not
        blind = await store.renew(
            a.fence, ttl=TTL, stage="load", progress_version=1, max_no_progress=BUDGET, grace=GRACE
        )
        print(f"node-a renews without progress: ok={blind.ok} reason={blind.reason} (zombie)")

        job = await store.get(key)
        assert job is not None
        await asyncio.sleep(job.lease_remaining + 0.05)
        c = await store.acquire(key, "node-b", ttl=TTL, max_no_progress=BUDGET)
        assert isinstance(c, Acquired)
        print(f"the lease lapsed; node-b took over with token {c.fence.token} (> {a.fence.token})")

        try:
            await store.commit(a.fence, "node-a's late result")
        except FencingRejected as exc:
            print(f"node-a woke up and tried to write: {exc}")
        done = await store.commit(c.fence, "node-b's result")
        print(f"one result: {done.result!r} by {done.owner_id}, status {done.status.value}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///.ai-lease/examples.db"))
