"""The front door in one run: run a job, submit one for a worker, cancel one, hold a lease.

    python examples/front_door.py [STORE_URL]

Uses ``sqlite:///.ai-lease/examples.db`` by default (no server needed); pass a
``redis://`` URL to run it on Redis. The provider is the offline ``local-extractive``.
"""

from __future__ import annotations

import asyncio
import sys
import time

import ai_lease
from ai_lease import Job, JobCancelled, LeaseTimings

TEXT = (
    "Leases keep one owner per job. A zombie owner keeps its heartbeat but makes no progress. "
    "ai_lease renews a lease only on real progress. A follower then takes over."
)


async def main(url: str) -> None:
    run = time.time_ns()
    timings = LeaseTimings(ttl=3, renew_interval=0.5, op_timeout=0.4, self_fence_margin=0.5)
    async with ai_lease.connect(url, timings=timings) as client:
        record = await client.run(Job(f"summary-{run}", input=TEXT))
        print(f"run: {record.output!r} (token {record.token})")

        await client.submit(Job(f"queued-{run}", input=TEXT))
        async with client.worker(concurrency=2, sweep_interval=0.1, grace=2):
            print(f"a worker ran the submitted job: {await client.result(f'queued-{run}')!r}")

        await client.submit(Job(f"unwanted-{run}", input=TEXT))
        await client.cancel(f"unwanted-{run}", "not needed after all")
        try:
            await client.result(f"unwanted-{run}")
        except JobCancelled as exc:
            print(f"cancelled: {exc}")

        async with client.lease(f"own-code-{run}", stage="load") as job:
            rows = []
            for n in range(5):  # your own work, one real step at a time
                await asyncio.sleep(0.1)
                rows.append(n * n)
                job.progress(n)
            job.stage("call_ai", max_no_progress=30)
            committed = await job.commit({"rows": rows})
        print(f"lease around own code: committed {committed.output} with token {job.token}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///.ai-lease/examples.db"))
