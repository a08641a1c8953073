"""The chaos scenarios' verdict (tests/harness/chaos_cluster.py ``check_job``) on histories
written here: what it takes as the one commit, and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ai_lease import open_store
from ai_lease.lease.base import Acquired
from tests.harness.chaos_cluster import check_job


async def _done_by(url: str, key: str, owner: str) -> int:
    """The store's record of ``key``: DONE, committed by ``owner``; its token."""
    store = open_store(url)
    try:
        won = await store.acquire(key, owner, ttl=30, max_no_progress=30)
        assert isinstance(won, Acquired)
        await store.commit(won.fence, '"the answer"')  # results are JSON documents
        return won.fence.token
    finally:
        await store.aclose()


def _line(at: float, kind: str, key: str, token: int, owner: str) -> dict[str, Any]:
    return {"at": at, "node": owner, "kind": kind, "key": key, "token": token, "owner_id": owner}


def _history(key: str, token: int, owner: str, proof: str | None) -> dict[str, list[Any]]:
    lines = [_line(1.0, "acquired", key, token, owner)]
    if proof is not None:
        lines.append(_line(2.0, proof, key, token, owner))
    lines.append({"at": 3.0, "node": owner, "kind": "exit", "key": key, "error": None})
    lines[-1]["result"] = "the answer"
    return {owner: lines}


@pytest.mark.parametrize("proof", ["committed", "commit_late", "commit_landed"])
async def test_each_kind_of_commit_proof_is_the_one_commit(tmp_path: Path, proof: str) -> None:
    """A commit its owner saw answered, one whose answer came after the owner stopped waiting
    (``commit_late``: applied), and one proven by a node killed right after writing."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    token = await _done_by(url, "k", "N2")
    verdict = await check_job(url, "k", _history("k", token, "N2", proof), ttl=30)
    assert (verdict.committer["kind"], verdict.committer["token"]) == (proof, token)


async def test_a_done_record_with_no_commit_in_any_history_is_refused(tmp_path: Path) -> None:
    """The store says DONE but no history shows the commit: the verdict fails."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    token = await _done_by(url, "k", "N2")
    with pytest.raises(AssertionError, match="0 committed"):
        await check_job(url, "k", _history("k", token, "N2", None), ttl=30)
