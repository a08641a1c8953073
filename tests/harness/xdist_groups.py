"""How the suite is spread over pytest-xdist workers (``scripts/test.sh`` runs ``-n 4``).

Each worker is a copy of the session with its own servers on free ports, so a test may run
on any of them, except where tests share a costly server of their own: a suite whose session
fixtures start model servers or Chromium runs whole on one worker (its servers start once),
and so does a module whose fixture starts servers once for the module. Everything else is
its own unit of work, handed to whichever worker is free.

The units are named here, from each test's path, rather than by ``xdist_group`` marks:
pytest 9.2's structured node ids drop the ``@group`` suffix that ``--dist loadgroup`` reads
(pytest-xdist issue 1386), and with it every group, silently.

>>> unit("tests/browser/test_dashboard.py::test_jobs_page[redis]")
'tests/browser'
>>> unit("tests/test_pg_harness.py::test_restart")
'tests/test_pg_harness.py'
>>> unit("tests/test_keeper.py::test_renews[sqlite]")
'tests/test_keeper.py::test_renews[sqlite]'
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadScopeScheduling

__all__ = ["START_FIRST", "WHOLE_CLASSES", "GroupedScheduling", "rank", "unit"]

WHOLE_DIRS = ("tests/browser", "tests/realservers")
"""Suites whose session fixtures start what is costly to start twice (Chromium; the model
servers)."""

WHOLE_MODULES = frozenset(
    f"tests/{name}.py"
    for name in (
        "test_log_json_whole",
        "test_pg_harness",
        "test_postgres_faults",
        "test_readme_blocks",
        "test_redis_cluster",
    )
)
"""Modules whose module-scoped fixture starts servers (or builds a venv) for all its tests."""


START_FIRST = (
    "tests/browser",
    "tests/realservers",
    "tests/test_readme_blocks.py",
    "tests/test_limits_fleet.py",
    "tests/test_new_user_walk.py",
    "tests/test_limits_rate_fleet.py",
    "tests/test_redis_cluster.py",
    "tests/test_detached_scenario.py",
    "tests/test_wheel.py",
    "tests/test_postgres_faults.py",
    "tests/chaos/test_soak.py",
    "tests/test_demo_ui.py",
    "tests/test_demo.py",
    "tests/test_log_json_whole.py",
)
"""The units that take longest (15 s to 3 min each, measured under six workers), handed out
before any other so the run never ends waiting on one started last. The three rpm-fleet
units (two minutes each, of eight worker processes) come after the first few: starting with
Chromium, the model servers and the README's venvs, on two cores, they would measure a machine
too starved to send what their limit granted on time. A path missing here costs time, never a
result."""


def rank(scope: str) -> int:
    """Where ``scope``'s unit goes in the queue: its place in :data:`START_FIRST`, or after
    all of those."""
    path = scope.split("::", 1)[0]
    return next(
        (i for i, first in enumerate(START_FIRST) if path == first or path.startswith(first + "/")),
        len(START_FIRST),
    )


WHOLE_CLASSES = ("tests/test_cli_lifecycle.py::TestClusterAdmin",)
"""Classes that use another module's module-scoped server fixture (a Redis Cluster of three
nodes): whole on one worker, so it starts once, not once per worker that runs one of them."""


def unit(nodeid: str) -> str:
    """The unit of work ``nodeid`` belongs to: its suite's directory, its module, its class,
    or itself."""
    for whole in WHOLE_CLASSES:
        if nodeid.startswith(whole + "::"):
            return whole
    path = nodeid.split("::", 1)[0]
    for directory in WHOLE_DIRS:
        if path.startswith(directory + "/"):
            return directory
    return path if path in WHOLE_MODULES else nodeid


class GroupedScheduling(LoadScopeScheduling):
    """pytest-xdist's scope scheduling, with :func:`unit` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)

    _ranked = False

    def _assign_work_unit(self, node: Any) -> None:
        """The first time, put the queue in :func:`rank` order (stable: xdist's own order
        among equals), so the longest units are handed out first."""
        if not self._ranked:
            ranked = sorted(self.workqueue.items(), key=lambda item: rank(item[0]))
            self.workqueue.clear()
            self.workqueue.update(ranked)
            self._ranked = True
        super()._assign_work_unit(node)
