"""Driving chaos nodes from a test, and checking the invariants their histories show.

    async with ChaosCluster(store_url, tmp_path) as cluster:
        a = await cluster.start("A", ["job-1"], faults="after:parse=kill")
        b = await cluster.start("B", ["job-1"], wait_for_go=True)
        await a.wait_for_event("acquired")
        cluster.go()
        ...
        verdict = await check_job(cluster.store_url, "job-1", cluster.histories(), ttl=2.0)

Nodes are ``tests/harness/chaos_node.py`` processes; a started node is a
:class:`~tests.harness.node.NodeProcess` (wait for history lines, signal, kill, dump).
:func:`check_job` extends :func:`~tests.harness.history.check_invariants` with what chaos
needs: a commit proven by ``commit_landed`` (an owner killed right after its write), model
calls counted per node, no commit after the committer fenced itself, and an opt-out of the
lease-window check for a store that lost its data.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ai_lease import JobState, Status
from tests.harness.history import check_acquisitions, of_kind, read_record
from tests.harness.node import NodeProcess, spawn

__all__ = ["PROFILE", "ChaosCluster", "Verdict", "check_job", "key_view", "report"]

# The fast timing profile of the chaos scenarios (seconds).
PROFILE = {
    "ttl": 2.0,
    "renew": 0.5,
    "op_timeout": 0.4,
    "poll": 0.1,
    "mnp": 3.0,
    "first_token": 2.0,
    "idle": 2.0,
    "total": 8.0,
}

Events = list[dict[str, Any]]


@dataclass
class ChaosCluster:
    """Chaos node processes on one store; ``aclose()`` SIGKILLs and reaps every one."""

    store_url: str
    directory: Path
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    @property
    def go_file(self) -> Path:
        return self.directory / "chaos.go"

    async def start(
        self,
        name: str,
        keys: Sequence[str],
        *,
        store_url: str | None = None,
        faults: str = "",
        calls: str = "ok",
        sse_url: str | None = None,
        wait_for_go: bool = False,
        env: Mapping[str, str] | None = None,
        **options: float,
    ) -> NodeProcess:
        """Start node ``name`` running ``keys``; ``options`` override the profile
        (``ttl=…``, ``chunks=…``, ``every=…``, ``slow_for=…``, ``job_deadline=…``)."""
        history = self.directory / f"{name}.history.jsonl"
        log = self.directory / f"{name}.log"
        args = [
            *("--store", store_url or self.store_url, "--keys", ",".join(keys)),
            *("--node", name, "--history", str(history), "--calls", calls),
            *(("--faults", faults) if faults else ()),
            *(("--sse-url", sse_url) if sse_url else ()),
            *(("--go-file", str(self.go_file)) if wait_for_go else ()),
        ]
        for option, value in {**PROFILE, **options}.items():
            args += [f"--{option.replace('_', '-')}", str(value)]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("CHAOS_")}
        child_env.update(env or {})
        node = await spawn("tests.harness.chaos_node", name, args, history, log, child_env)
        self.nodes[name] = node
        return node

    async def start_ready(self, name: str, keys: Sequence[str], **kwargs: Any) -> NodeProcess:
        """Start a node held back by the go file and wait until it has reached the store."""
        node = await self.start(name, keys, wait_for_go=True, **kwargs)
        await node.wait_for_event("ready", f"{name} to reach the store", timeout=30)
        return node

    def go(self, at: float | None = None) -> None:
        """Release every node started with ``wait_for_go`` (at wall-clock instant ``at``)."""
        self.go_file.write_text("" if at is None else repr(at))

    def histories(self) -> dict[str, Events]:
        return {name: node.events() for name, node in self.nodes.items()}

    def dump(self) -> str:
        return "\n".join(node.dump() for node in self.nodes.values())

    async def aclose(self) -> None:
        for node in self.nodes.values():
            await node.kill()

    async def __aenter__(self) -> ChaosCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- checking ----------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the histories and the store say about one key, once the checks passed."""

    record: JobState
    committer: dict[str, Any]
    acquisitions: Events
    calls: Counter[str]
    errors: dict[str, str]

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


def key_view(histories: Mapping[str, Events], key: str) -> dict[str, Events]:
    """Each node's lines about ``key`` (lines without a key, like ``fault``, kept too)."""
    return {
        node: [e for e in events if e.get("key") in (key, None, "")]
        for node, events in histories.items()
    }


def explain(histories: Mapping[str, Events]) -> str:
    lines = [
        f"  {e['at']:.3f} {e['node']:>8} {e['kind']:<18} token={e.get('token')} "
        f"{str(e.get('detail', '') or e.get('point', '') or e.get('error', ''))[:100]}"
        for e in sorted(itertools.chain.from_iterable(histories.values()), key=lambda e: e["at"])
        if e["kind"] not in ("chunk", "stage_done", "renewed")
    ]
    return "timeline:\n" + "\n".join(lines)


def _acquisitions_rise(acquired: Events, story: str) -> None:
    for before, after in itertools.pairwise(acquired):
        assert after["token"] > before["token"], (
            f"token {after['token']} of {after['owner_id']} is not above token "
            f"{before['token']} of {before['owner_id']}\n{story}"
        )


async def check_job(
    store_url: str,
    key: str,
    histories: Mapping[str, Events],
    *,
    ttl: float,
    data_loss: bool = False,
    unacknowledged_ok: bool = False,
    slack: float = 0.5,
) -> Verdict:
    """Assert the DESIGN.md invariants for ``key`` over the store and every history:

    * the record is DONE and exactly one commit exists across all histories (a
      ``committed`` event, a ``commit_late`` one of an owner whose commit's answer came after
      it had stopped waiting (applied), or a ``commit_landed`` line of an owner killed right
      after its write), carrying the record's (token, owner); with ``unacknowledged_ok``, none at
      all is accepted if the stored (token, owner) did acquire the job (a commit that
      landed but whose answer its owner never got);
    * fencing tokens rise strictly across acquisitions in time order, and (unless the store
      lost its data: ``data_loss``) no owner acquired inside another's live lease;
    * every rejected write carried an older token; no late write was accepted;
    * no owner committed after it fenced itself;
    * every node that returned a result returned the stored one.
    """
    view = key_view(histories, key)
    story = explain(view)
    record = await read_record(store_url, key)
    assert record is not None, f"the store holds no record for {key!r}\n{story}"
    assert record.status is Status.DONE, (
        f"{key!r} ended {record.status.value}: {record.last_error}\n{story}"
    )

    acquired = sorted((e for h in view.values() for e in of_kind(h, "acquired")), key=_at)
    proofs = [
        e for h in view.values() for e in of_kind(h, "committed", "commit_late", "commit_landed")
    ]
    pairs = {(e["token"], e["owner_id"]) for e in proofs}
    stored = (record.token, record.owner_id)
    if not pairs and unacknowledged_ok:
        # The commit landed but its answer was lost and its owner fenced itself before
        # a retry: the store is the truth; the stored pair must be one that acquired.
        proofs = [e for e in acquired if (e["token"], e["owner_id"]) == stored]
        pairs = {stored} if proofs else set()
    assert len(pairs) == 1, f"{len(pairs)} committed (token, owner) pairs, want 1\n{story}"
    assert pairs == {stored}, (
        f"the commit {pairs} is not the stored owner (token {record.token} of "
        f"{record.owner_id})\n{story}"
    )
    committer = min(proofs, key=lambda e: e["at"])

    _acquisitions_rise(acquired, story)
    if not data_loss:
        check_acquisitions(view, ttl=ttl, slack=slack)

    accepted = [e for h in view.values() for e in of_kind(h, "late_commit_accepted")]
    assert not accepted, f"a late write with an old fence was accepted: {accepted}\n{story}"
    for rejected in (e for h in view.values() for e in of_kind(h, "fenced")):
        if rejected.get("token") is not None:
            assert rejected["token"] < record.token, (
                f"a rejected write carried token {rejected['token']}, not older than the "
                f"committed token {record.token}\n{story}"
            )

    for history in view.values():
        for fenced in of_kind(history, "self_fenced"):
            late = [
                e
                for e in of_kind(history, "committed", "commit_landed", owner_id=fenced["owner_id"])
                if e["at"] > fenced["at"]
            ]
            assert not late, f"{fenced['owner_id']} committed after fencing itself\n{story}"

    errors = {}
    for node, history in view.items():
        for done in (e for e in of_kind(history, "exit") if e.get("key") == key):
            if done["error"] is None:
                assert done["result"] == record.output, (
                    f"node {node} returned {done['result']!r}, the store holds "
                    f"{record.output!r}\n{story}"
                )
            else:
                errors[node] = done["error"]
    calls = Counter({node: len(of_kind(h, "call")) for node, h in view.items()})
    return Verdict(record, committer, acquired, calls, errors)


def _at(event: dict[str, Any]) -> float:
    return float(event["at"])


def report(scenario: str, store_url: str = "", **measured: float | int | str) -> None:
    """Print measured figures (``pytest -s``) and, with ``CHAOS_REPORT=path``, append them
    to that file as one JSON line (docs/reliability.md quotes them)."""
    backend = store_url.split(":", 1)[0] if store_url else "-"
    numbers = " ".join(
        f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}"
        for name, value in measured.items()
    )
    print(f"\nCHAOS {backend:<6} {scenario:<28} {numbers}")
    path = os.environ.get("CHAOS_REPORT")
    if path:
        line = {"scenario": scenario, "backend": backend, **measured}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
