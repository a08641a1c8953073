"""What the store contract's test classes share: unique keys, owning and renewing a job."""

from __future__ import annotations

import itertools
import time
from typing import Any

from ai_lease.lease.base import Acquired, Fence, LeaseStore

_ids = itertools.count()


def key_for(name: str) -> str:
    return f"contract-{name}-{time.time_ns()}-{next(_ids)}"


async def own(store: LeaseStore, key: str, owner: str = "A", ttl: float = 30.0, **kw: Any) -> Fence:
    outcome = await store.acquire(key, owner, ttl=ttl, max_no_progress=kw.pop("mnp", 30.0), **kw)
    assert isinstance(outcome, Acquired), outcome
    return outcome.fence


async def renew(
    store: LeaseStore,
    fence: Fence,
    version: int,
    mnp: float = 30.0,
    ttl: float = 30.0,
    grace: float = 0.0,
) -> Any:
    return await store.renew(
        fence, ttl=ttl, stage="call_ai", progress_version=version, max_no_progress=mnp, grace=grace
    )
