"""``cpu_idle_pct`` from a stored child snapshot, in ``status``, ``status --json`` and the
dashboard's job page (ai_lease/observe/cpu_idle.py), on a real SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from ai_lease import Acquired, open_store
from ai_lease.lease.timeline import JobTimeline
from ai_lease.observe.cpu_idle import cpu_idle_of, cpu_idle_text
from ai_lease.run.isolation.evidence import ChildSnapshot
from ai_lease.ui.render import Templates, job_context
from tests.test_cli_basics import run_cli

STACKS = 'Thread 0x1 (most recent call first):\n  File "stage.py", line 3 in stuck'


def snapshot(idle: float | None) -> str:
    return ChildSnapshot(STACKS, 31_000_000, 0.03, idle, 16, 3, 2).render()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (snapshot(99.5), 99.5),
        (snapshot(None), "unavailable"),
        ("stalled in call_ai\n  File x.py, line 1, in wait", None),
        (None, None),
    ],
)
def test_the_figure_is_read_back_from_the_rendered_snapshot(
    text: str | None, want: float | str | None
) -> None:
    """A child's snapshot gives its number (or "unavailable"); one without figures, None."""
    assert cpu_idle_of(text) == want


def test_the_text_says_a_stuck_wait_from_95_percent_idle() -> None:
    """The seed's CPU < 5 %: a stuck wait; below it, a busy child."""
    assert cpu_idle_text(96.0).endswith("a stuck wait, not slow work")
    assert cpu_idle_text(12.5).startswith("12.5 % idle") and "busy" in cpu_idle_text(12.5)


def seeded(url: str, snap: str) -> str:
    """A job stalled with ``snap`` stored; returns its dashboard section."""

    async def seed() -> str:
        store = open_store(url)
        try:
            won = await store.acquire("stuck", "node-a", ttl=30, max_no_progress=30)
            assert isinstance(won, Acquired)
            assert await store.report_stall(won.fence, "call_ai", f"stalled\n{snap}")
            job = await store.get("stuck")
            assert job is not None and isinstance(store, JobTimeline)
            entries, dropped = await store.timeline("stuck")
            return Templates().render("_job_live.html", **job_context(job, entries, dropped))
        finally:
            await store.aclose()

    return asyncio.run(seed())


def test_status_and_the_page_show_cpu_idle_of_a_child_snapshot(tmp_path: Path) -> None:
    """A stuck child's snapshot: a 'cpu idle' row in status, the number in --json, a
    ``#cpu-idle`` entry on the page."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    page = seeded(url, snapshot(99.0))
    assert 'id="cpu-idle">99.0 % idle since the last progress: a stuck wait' in page
    out = run_cli("--store", url, "status", "stuck", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "cpu idle    99.0 % idle since the last progress: a stuck wait" in out.stdout
    js = orjson.loads(run_cli("--store", url, "status", "stuck", "--json", cwd=tmp_path).stdout)
    assert js["cpu_idle_pct"] == 99.0


def test_a_snapshot_without_figures_shows_no_cpu_idle(tmp_path: Path) -> None:
    """Task isolation's snapshot (one coroutine's stack) has no figures: no row, null."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    page = seeded(url, "  File stage.py, line 3, in wait")
    assert 'id="cpu-idle"' not in page
    out = run_cli("--store", url, "status", "stuck", cwd=tmp_path)
    assert "cpu idle" not in out.stdout and "stuck at" in out.stdout
    js = orjson.loads(run_cli("--store", url, "status", "stuck", "--json", cwd=tmp_path).stdout)
    assert js["cpu_idle_pct"] is None
