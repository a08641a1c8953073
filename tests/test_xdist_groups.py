"""The units the suite is spread over workers in (tests/harness/xdist_groups.py): every module
with a module-scoped fixture runs whole on one worker, and so does every suite with session
fixtures of its own; a unit names no file that is gone."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

from tests.harness import xdist_groups
from tests.harness.xdist_groups import (
    START_FIRST,
    WHOLE_CLASSES,
    WHOLE_DIRS,
    WHOLE_MODULES,
    rank,
    unit,
)

ROOT = Path(__file__).resolve().parents[1]
SCOPED = re.compile(r"@pytest\.fixture\(scope=\"(module|session)\"")


def test_its_examples_hold() -> None:
    assert doctest.testmod(xdist_groups).failed == 0


def test_each_module_with_a_module_fixture_is_one_unit() -> None:
    scoped = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").glob("test_*.py")
        if "module" in SCOPED.findall(path.read_text())
    }
    assert scoped == WHOLE_MODULES
    for module in scoped:
        assert unit(f"{module}::test_a") == unit(f"{module}::test_b[x]") == module


def test_each_suite_with_session_fixtures_of_its_own_is_one_unit() -> None:
    own = {
        conftest.parent.relative_to(ROOT).as_posix()
        for conftest in (ROOT / "tests").glob("*/conftest.py")
        if SCOPED.search(conftest.read_text())
    }
    assert own == set(WHOLE_DIRS)
    for directory in own:
        assert unit(f"{directory}/test_x.py::test_a") == directory


def test_any_other_test_is_a_unit_of_its_own() -> None:
    for nodeid in ("tests/test_keeper.py::test_a[redis]", "tests/chaos/test_soak.py::test_a"):
        assert unit(nodeid) == nodeid


def test_the_longest_units_are_named_by_paths_that_exist_and_go_first() -> None:
    for path in START_FIRST:
        assert (ROOT / path).exists(), path
    assert rank("tests/browser") == 0 < rank("tests/test_readme_blocks.py")
    assert rank("tests/test_limits_rate_fleet.py::test_x[redis]") < len(START_FIRST)
    assert rank("tests/test_keeper.py::test_renews[sqlite]") == len(START_FIRST)


def test_a_class_that_borrows_a_module_server_fixture_is_one_unit() -> None:
    """A test module that imports another's module-scoped fixture starts that server for
    itself: its class using it is one unit (named in WHOLE_CLASSES)."""
    borrowed = re.compile(r"^from tests\.test_\w+ import .*\b(cluster)\b", re.M)
    borrowers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").glob("test_*.py")
        if borrowed.search(path.read_text())
    }
    assert borrowers == {whole.split("::")[0] for whole in WHOLE_CLASSES}
    for whole in WHOLE_CLASSES:
        assert unit(f"{whole}::test_a") == unit(f"{whole}::test_b[x]") == whole
