"""The lease-store contract's checkpoints: where a resumable stream stood, kept by renewals.

Part of :class:`~ai_lease.testing.contract.LeaseStoreContract`, which every store passes.
A renewal that carries a checkpoint stores it atomically with the renewal, fenced like it;
the next owner's acquire and ``get`` read it; commit, fail, cancel and retry clear it.
"""

from __future__ import annotations

import asyncio

import pytest

from ai_lease.errors import FencingRejected, InputError
from ai_lease.lease.admin import JobAdmin
from ai_lease.lease.base import CHECKPOINT_LIMIT, Acquired, Fence, LeaseStore
from ai_lease.testing.contract_support import key_for, own

CHECKPOINT = '{"provider":"p","response_id":"resp_1","sequence":7,"text":"half an ans\\u00e9wer"}'


async def _renew(
    store: LeaseStore, fence: Fence, version: int, checkpoint: str | None, ttl: float = 30.0
) -> bool:
    answer = await store.renew(
        fence,
        ttl=ttl,
        stage="call_ai",
        progress_version=version,
        max_no_progress=30.0,
        grace=0.0,
        checkpoint=checkpoint,
    )
    return answer.ok


class CheckpointContract:
    """Checkpoints written by renewals (issue 15 item 6); a mixin of
    :class:`~ai_lease.testing.contract.LeaseStoreContract`."""

    async def test_renewal_checkpoint_is_read_by_get_and_next_owner(
        self, store: LeaseStore
    ) -> None:
        """A renewal's checkpoint is in the record (get) and in the next owner's Acquired."""
        key = key_for("ckpt")
        fence = await own(store, key, "node-a#1.x")
        assert await _renew(store, fence, 1, CHECKPOINT)
        job = await store.get(key)
        assert job is not None and job.checkpoint == CHECKPOINT
        assert await _renew(store, fence, 2, None, ttl=0.3), "None keeps the stored one"
        job = await store.get(key)
        assert job is not None and job.checkpoint == CHECKPOINT
        await asyncio.sleep(0.6)  # the owner stops renewing: its lease lapses
        taken = await store.acquire(key, "node-b#1.y", ttl=30, max_no_progress=30)
        assert isinstance(taken, Acquired) and taken.takeover
        assert taken.job.checkpoint == CHECKPOINT

    async def test_stale_fence_checkpoint_is_not_written(self, store: LeaseStore) -> None:
        """A refused renewal (a stale fence) writes no checkpoint."""
        key = key_for("ckpt-stale")
        old = await own(store, key, "node-a#1.x", ttl=0.2)
        await asyncio.sleep(0.4)
        new = await own(store, key, "node-b#1.y")
        assert not await _renew(store, old, 5, CHECKPOINT)
        job = await store.get(key)
        assert job is not None and job.checkpoint is None
        assert await _renew(store, new, 1, '{"mine":1}')
        assert not await _renew(store, old, 6, CHECKPOINT)
        job = await store.get(key)
        assert job is not None and job.checkpoint == '{"mine":1}'

    async def test_commit_clears_the_checkpoint(self, store: LeaseStore) -> None:
        """The committed record holds the result, not the checkpoint."""
        key = key_for("ckpt-commit")
        fence = await own(store, key)
        assert await _renew(store, fence, 1, CHECKPOINT)
        done = await store.commit(fence, '"the answer"')
        assert done.checkpoint is None
        job = await store.get(key)
        assert job is not None and job.checkpoint is None and job.result == '"the answer"'

    async def test_fail_and_retry_leave_no_checkpoint(self, store: LeaseStore) -> None:
        """A failed job, sent back by retry, starts its new run with no checkpoint."""
        key = key_for("ckpt-retry")
        fence = await own(store, key)
        assert await _renew(store, fence, 1, CHECKPOINT)
        assert (await store.fail(fence, "broken")).checkpoint is None
        if isinstance(store, JobAdmin):
            again = await store.retry(key)
            assert again is not None and again.checkpoint is None
            won = await store.acquire(key, "B", ttl=30, max_no_progress=30)
            assert isinstance(won, Acquired) and won.job.checkpoint is None

    async def test_oversized_checkpoint_is_refused(self, store: LeaseStore) -> None:
        """A checkpoint over CHECKPOINT_LIMIT raises InputError and changes nothing."""
        key = key_for("ckpt-big")
        fence = await own(store, key)
        assert await _renew(store, fence, 1, CHECKPOINT)
        before = await store.get(key)
        with pytest.raises(InputError, match="over the limit"):
            await _renew(store, fence, 2, "é" * (CHECKPOINT_LIMIT // 2 + 1))
        job = await store.get(key)
        assert job is not None and before is not None
        assert job.checkpoint == CHECKPOINT and job.progress_version == before.progress_version
        with pytest.raises(FencingRejected):  # the fence still rules commits as before
            await store.commit(Fence(key, "other", fence.token), "x")
