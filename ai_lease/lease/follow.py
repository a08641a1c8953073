"""The follower's loop: compete for a job, and while another owner holds it, wait.

A follower wakes on the owner's events (commit, fail, release: pub/sub on Redis, polling on
SQLite) or when the owner's lease can have lapsed, whichever is first, and competes again.
It never decides a takeover itself: ``acquire`` is the judge, on the store's clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ai_lease.lease.base import Acquired, Finished, Following, LeaseStore

__all__ = ["acquire_or_follow"]

# The store's clock and ours may tick at slightly different rates; re-check a little after
# the lease should have lapsed rather than exactly at it.
_LAPSE_SLACK = 0.01


async def acquire_or_follow(
    store: LeaseStore,
    key: str,
    owner_id: str,
    *,
    ttl: float,
    max_no_progress: float,
    poll_interval: float,
    stall_policy: str = "expire",
    fingerprint: str | None = None,
    max_attempts: int | None = None,
    renew_interval: float | None = None,
    on_follow: Callable[[Following], Awaitable[None] | None] | None = None,
    on_send: Callable[[], None] | None = None,
) -> Acquired | Finished:
    """Acquire ``key`` or wait until it is ours or finished; never returns :class:`Following`.

    ``on_follow`` is called with each :class:`Following` answer (to show who owns the job);
    ``on_send`` just before each acquire is sent (an owner's lease runs from then).
    """
    while True:
        if on_send is not None:
            on_send()
        outcome = await store.acquire(
            key,
            owner_id,
            ttl=ttl,
            max_no_progress=max_no_progress,
            stall_policy=stall_policy,
            fingerprint=fingerprint,
            max_attempts=max_attempts,
            renew_interval=renew_interval,
        )
        if not isinstance(outcome, Following):
            return outcome
        if on_follow is not None:
            pending = on_follow(outcome)
            if pending is not None:
                await pending
        await store.wait(key, min(poll_interval, outcome.lease_remaining + _LAPSE_SLACK))
