"""Reading node history files, and checking the lease invariants they and the store show.

A history is the JSON-lines file one node process wrote (``tests/harness/node.py``): the
runner's events plus the node's own lines, each with ``kind``, ``node`` and ``at`` (wall
time; every node runs on this machine, and the stores' clocks are this machine's clock).

    histories = {"A": read_history(a_path), "B": read_history(b_path)}
    record = await check_invariants(store_url, "job-1", histories)
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ai_lease import JobState, Status, open_store

__all__ = [
    "check_acquisitions",
    "check_invariants",
    "last_progress_at",
    "of_kind",
    "read_history",
    "read_record",
]

History = Sequence[dict[str, Any]]

# Event times are taken when a reply arrives; the store acted a little earlier. Lease
# windows rebuilt from histories are compared with this much slack.
DEFAULT_SLACK_S = 0.5
REJECTED_WRITES = ("fenced", "late_commit_rejected")


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a history file; a last line cut short (a SIGKILL mid-write) is dropped."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete = lines[:-1]  # the part after the last newline is empty or still being written
    return [json.loads(line) for line in complete if line.strip()]


def of_kind(history: History, *kinds: str, owner_id: str | None = None) -> list[dict[str, Any]]:
    """The events of ``history`` of one of ``kinds`` (and of ``owner_id``, if given)."""
    return [
        e
        for e in history
        if e["kind"] in kinds and (owner_id is None or e.get("owner_id") == owner_id)
    ]


def last_progress_at(history: History) -> float:
    """When the node last made real progress: its last streamed chunk or stage entry."""
    return max(float(e["at"]) for e in of_kind(history, "chunk", "stage"))


def _all(histories: Mapping[str, History]) -> list[dict[str, Any]]:
    return sorted(itertools.chain.from_iterable(histories.values()), key=lambda e: e["at"])


def _ttl_of(histories: Mapping[str, History], node: str, default: float | None) -> float:
    started = of_kind(histories.get(node, ()), "started")
    if started:
        return float(started[0]["ttl"])
    if default is None:
        raise AssertionError(f"node {node} wrote no 'started' line and no ttl was given")
    return default


def _lease_end(history: History, owner_id: str, ttl: float) -> float:
    """The latest moment ``owner_id``'s lease can have lasted until, from its own history."""
    held = of_kind(history, "acquired", "renewed", owner_id=owner_id)
    end = max(float(e["at"]) for e in held) + ttl
    gave_up = of_kind(history, "released", "committed", owner_id=owner_id)
    if gave_up:
        end = min(end, *(float(e["at"]) for e in gave_up))
    return end


def _explain(histories: Mapping[str, History]) -> str:
    lines = [
        f"  {e['at']:.3f} {e['node']:>6} {e['kind']:<20} token={e.get('token')} "
        f"{str(e.get('detail', ''))[:90]}"
        for e in _all(histories)
        if e["kind"] not in ("chunk",)
    ]
    return "timeline:\n" + "\n".join(lines)


def check_acquisitions(
    histories: Mapping[str, History], *, ttl: float | None = None, slack: float = DEFAULT_SLACK_S
) -> None:
    """Tokens rise strictly with every acquisition; no acquisition inside a live lease."""
    acquired = [e for e in _all(histories) if e["kind"] == "acquired"]
    for before, after in itertools.pairwise(acquired):
        assert after["token"] > before["token"], (
            f"token {after['token']} of {after['owner_id']} is not above token "
            f"{before['token']} of {before['owner_id']}\n{_explain(histories)}"
        )
        if after["owner_id"] == before["owner_id"]:
            continue
        end = _lease_end(
            histories[before["node"]], before["owner_id"], _ttl_of(histories, before["node"], ttl)
        )
        assert after["at"] >= end - slack, (
            f"{after['owner_id']} acquired at {after['at']:.3f}, inside the lease of "
            f"{before['owner_id']} that lasted until {end:.3f}\n{_explain(histories)}"
        )


async def read_record(store_url: str, key: str) -> JobState | None:
    """The store's record for ``key`` right now, through a store opened for this read."""
    store = open_store(store_url)
    try:
        return await store.get(key)
    finally:
        await store.aclose()


async def check_invariants(
    store_url: str,
    key: str,
    histories: Mapping[str, History],
    *,
    ttl: float | None = None,
    slack: float = DEFAULT_SLACK_S,
) -> JobState:
    """Assert the lease invariants over the store's final record and every node's history.

    * exactly one result: the record is DONE, and exactly one ``committed`` event exists
      across all histories, carrying the record's (token, owner);
    * fencing tokens rise strictly across ``acquired`` events in time order, and no owner
      acquired while another's lease (rebuilt from its renewals) could still be live;
    * every rejected write (``fenced``, ``late_commit_rejected``) carried an older token
      than the committed one, and no late write was accepted;
    * every node that returned a result returned the committed one.

    Returns the record, for scenario-specific checks. ``ttl`` is needed only for histories
    without a ``started`` line.
    """
    record = await read_record(store_url, key)
    story = _explain(histories)
    assert record is not None, f"the store holds no record for {key!r}\n{story}"
    assert record.status is Status.DONE, f"{key!r} ended {record.status.value}\n{story}"

    committed = [e for h in histories.values() for e in of_kind(h, "committed")]
    assert len(committed) == 1, f"{len(committed)} committed events, want 1\n{story}"
    assert (committed[0]["token"], committed[0]["owner_id"]) == (record.token, record.owner_id), (
        f"the committed event {committed[0]} is not the stored owner "
        f"(token {record.token} of {record.owner_id})\n{story}"
    )

    check_acquisitions(histories, ttl=ttl, slack=slack)

    accepted = [e for h in histories.values() for e in of_kind(h, "late_commit_accepted")]
    assert not accepted, f"a late write with an old fence was accepted: {accepted}\n{story}"
    for rejected in (e for h in histories.values() for e in of_kind(h, *REJECTED_WRITES)):
        assert rejected["token"] < record.token, (
            f"a rejected write carried token {rejected['token']}, not older than the "
            f"committed token {record.token}\n{story}"
        )

    for node, history in histories.items():
        for done in of_kind(history, "exit"):
            if done["error"] is None:
                assert done["result"] == record.output, (
                    f"node {node} returned {done['result']!r}, the store holds "
                    f"{record.output!r}\n{story}"
                )
    return record
