"""`ai-lease events KEY` through the real entry point as a subprocess, on SQLite and Redis:
the timeline's lines, ``--json``, an unknown key, ``--follow`` to the end and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease.errors import FencingRejected
from ai_lease.lease import Acquired
from tests.test_cli_lifecycle import _on
from tests.test_cli_submit import run_cli


async def _taken_over(store: Any) -> None:
    """A job owned by node-a, lapsed, taken over by node-b, node-a's commit rejected."""
    import asyncio

    old = await store.acquire("job", "node-a#1", ttl=0.2, max_no_progress=30)
    assert isinstance(old, Acquired)
    await asyncio.sleep(0.3)  # real: the CLI runs as a subprocess on a real store
    new = await store.acquire("job", "node-b#1", ttl=30, max_no_progress=30)
    assert isinstance(new, Acquired) and new.takeover
    await store.renew(
        new.fence, ttl=30, stage="call_ai", progress_version=2, max_no_progress=30, grace=1
    )
    with pytest.raises(FencingRejected):
        await store.commit(old.fence, '"late"')
    await store.commit(new.fence, '"answer"')


def test_events_prints_the_timeline_and_json(store_url: str, tmp_path: Path) -> None:
    _on(store_url, _taken_over)
    out = run_cli("--store", store_url, "events", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    kinds = ["acquired", "taken over", "renewed", "fenced write rejected", "committed"]
    assert len(lines) == len(kinds)
    for text, kind in zip(lines, kinds, strict=True):
        assert f"  {kind}  " in text, text
    assert "node-b#1" in lines[1] and "expired from node-a#1" in lines[1]
    assert "stage call_ai" in lines[2] and "progress +2" in lines[2]
    assert "node-a#1" in lines[3] and lines[3].endswith("newer_owner")
    raw = run_cli("--store", store_url, "events", "job", "--json", cwd=tmp_path)
    assert raw.returncode == 0, raw.stderr
    entries = [orjson.loads(text) for text in raw.stdout.splitlines()]
    assert [e["kind"] for e in entries] == [k.replace(" ", "_") for k in kinds]
    assert [e["seq"] for e in entries] == [1, 2, 3, 4, 5]
    assert entries[1]["token"] == entries[4]["token"] != entries[3]["token"]
    assert all(e["key"] == "job" for e in entries)


def test_events_of_an_unknown_key_exits_2_naming_it(store_url: str, tmp_path: Path) -> None:
    _on(store_url, lambda store: store.get("other"))  # the store exists (submit made it)
    out = run_cli("--store", store_url, "events", "no-such-job", cwd=tmp_path)
    assert out.returncode == 2 and "'no-such-job'" in out.stderr, out.stderr
    assert out.stdout == ""


def _follow(store_url: str, tmp_path: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    command = [sys.executable, "-m", "ai_lease", "--store", store_url, "events", "run", "--follow"]
    return subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def _running(store: Any) -> None:
    won = await store.acquire("run", "node-a#1", ttl=60, max_no_progress=60)
    assert isinstance(won, Acquired)


async def _finish(store: Any) -> None:
    won = await store.acquire("run", "node-a#1", ttl=60, max_no_progress=60)
    assert isinstance(won, Acquired)
    await store.renew(
        won.fence, ttl=60, stage="parse", progress_version=1, max_no_progress=60, grace=1
    )
    await store.commit(won.fence, '"r"')


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()


def test_follow_prints_new_entries_until_the_job_ends(store_url: str, tmp_path: Path) -> None:
    _on(store_url, _running)
    proc = _follow(store_url, tmp_path)
    try:
        assert "acquired" in _first_line(proc)
        _on(store_url, _finish)
        rest, err = proc.communicate(timeout=20)
    finally:
        proc.kill()  # a no-op if it ended; reaped and its pipes closed either way
        proc.communicate()
    assert proc.returncode == 0, err
    kinds = [text.split()[1] for text in rest.splitlines()]
    assert kinds == ["renewed", "committed"], rest


def test_ctrl_c_stops_follow_quietly_with_130(store_url: str, tmp_path: Path) -> None:
    _on(store_url, _running)
    proc = _follow(store_url, tmp_path)
    try:
        assert "acquired" in _first_line(proc)
        # real: the CLI runs as a subprocess on a real store
        time.sleep(0.3)  # inside the follow's wait
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()  # a no-op if it ended; reaped and its pipes closed either way
        proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err, err
