"""A racing acquirer in its own OS process, for the store contract suite.

``python -m ai_lease.testing.race URL START_AT OWNER KEY...`` sleeps until the wall-clock time
``START_AT``, acquires every key at once and prints one JSON line per key:
``{"key": ..., "outcome": "Acquired" | "Following" | "Finished", "token": ...}``.
"""

from __future__ import annotations

import asyncio
import sys
import time

import orjson

from ai_lease.lease import Acquired
from ai_lease.stores import open_store


async def race(url: str, start_at: float, owner: str, keys: list[str]) -> list[dict[str, object]]:
    store = open_store(url, op_timeout=10.0)
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        outcomes = await asyncio.gather(
            *(store.acquire(k, owner, ttl=30.0, max_no_progress=30.0) for k in keys)
        )
    finally:
        await store.aclose()
    return [
        {
            "key": k,
            "outcome": type(o).__name__,
            "token": o.fence.token if isinstance(o, Acquired) else None,
        }
        for k, o in zip(keys, outcomes, strict=True)
    ]


def main(argv: list[str]) -> None:
    url, start_at, owner, *keys = argv
    for row in asyncio.run(race(url, float(start_at), owner, keys)):
        sys.stdout.write(orjson.dumps(row).decode() + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
