"""`ai-lease demo` end to end: a zombie owner is taken over and its late write rejected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson


def test_demo_shows_takeover_and_rejected_late_write(tmp_path: Path) -> None:
    """The demo's three nodes: one stall, one takeover with a higher token, one result."""
    out = subprocess.run(
        [sys.executable, "-m", "ai_lease", "demo", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    events = [orjson.loads(line) for line in out.stdout.splitlines()]
    acquired = [e for e in events if e["kind"] == "acquired"]
    assert len(acquired) == 2 and acquired[1]["token"] > acquired[0]["token"]
    assert acquired[0]["node"] != acquired[1]["node"]
    stalled = [e for e in events if e["kind"] == "stalled"]
    assert [e["node"] for e in stalled] == [acquired[0]["node"]]
    committed = [e for e in events if e["kind"] == "committed"]
    assert [(e["node"], e["token"]) for e in committed] == [
        (acquired[1]["node"], acquired[1]["token"])
    ]
    late = [e for e in events if e["kind"] == "late_write"]
    assert len(late) == 1 and late[0]["detail"].startswith("rejected")
    renewals = [e for e in events if e["kind"] == "renewed" and e["node"] == acquired[0]["node"]]
    assert renewals, "the zombie's heartbeat renewed while its call hung"
    exits = {e["node"]: e["detail"] for e in events if e["kind"] == "exit"}
    assert len(exits) == 3 and len(set(exits.values())) == 1
