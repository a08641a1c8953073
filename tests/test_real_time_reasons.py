"""Every real sleep in the tests says why it must be real.

A test that waits on the wall clock is slow on an idle machine and flaky on a loaded one,
so the default is virtual time (``ai_lease.testing.clock.on_virtual_time``). A real wait
stays only where the code under test does not wait on the loop's timers alone: a store
that answers from its thread, a child process, a socket to a server. This scan finds
every ``asyncio.sleep`` / ``time.sleep`` with a non-zero number in the modules under
``tests/`` (the chaos, browser and real-server suites apart: they are real by nature) and
asks that a reader can find the reason, in one of these places:

- a ``# real: <why>`` comment on the line, or anywhere in an enclosing function (its
  decorators and the comment lines just above it included);
- a ``# virtual: <why>`` comment there instead, for a helper that only runs on a
  virtual loop, or a function decorated with ``@on_virtual_time`` around it;
- a module-level ``REAL_TIME = "<why>"`` string, where a whole module waits for one reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parent
APART = {"chaos", "browser", "realservers"}
SLEEPS = {("asyncio", "sleep"), ("time", "sleep")}
REASON = re.compile(r"#\s*(real|virtual)\b")


def _modules() -> list[Path]:
    return sorted(
        path for path in TESTS.rglob("*.py") if path.relative_to(TESTS).parts[0] not in APART
    )


def _real_sleep(node: ast.AST) -> bool:
    """``asyncio.sleep(0.2)`` or ``time.sleep(1)``: a call with a non-zero number."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner = node.func.value
    if not isinstance(owner, ast.Name) or (owner.id, node.func.attr) not in SLEEPS:
        return False
    args = [*node.args, *(k.value for k in node.keywords)]
    return any(
        isinstance(a, ast.Constant) and isinstance(a.value, int | float) and a.value != 0
        for a in args[:1]
    )


def _has_real_time(tree: ast.Module) -> bool:
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "REAL_TIME" for t in targets):
            value = stmt.value  # type: ignore[union-attr]
            return isinstance(value, ast.Constant) and bool(str(value.value).strip())
    return False


def _on_virtual_time(func: ast.AST) -> bool:
    decorators = getattr(func, "decorator_list", [])
    return any(ast.unparse(d).endswith("on_virtual_time") for d in decorators)


def _span(func: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> range:
    first = min([func.lineno, *(d.lineno for d in func.decorator_list)])
    while first > 1 and lines[first - 2].lstrip().startswith("#"):
        first -= 1
    return range(first, (func.end_lineno or func.lineno) + 1)


def _unexplained(path: Path, root: Path = TESTS) -> list[str]:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    if _has_real_time(tree):
        return []
    lines = text.splitlines()
    said = {n for n, line in enumerate(lines, 1) if REASON.search(line)}
    found: list[str] = []

    def visit(node: ast.AST, spans: list[range], virtual: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans = [*spans, _span(node, lines)]
            virtual = virtual or _on_virtual_time(node)
        if _real_sleep(node) and not virtual:
            here = {node.lineno, node.lineno - 1}  # type: ignore[attr-defined]
            if not (here & said or any(said.intersection(s) for s in spans)):
                found.append(f"{path.relative_to(root)}:{node.lineno}")  # type: ignore[attr-defined]
        for child in ast.iter_child_nodes(node):
            visit(child, spans, virtual)

    visit(tree, [], False)
    return found


def test_every_real_sleep_in_the_tests_says_why() -> None:
    unexplained = [where for path in _modules() for where in _unexplained(path)]
    assert not unexplained, (
        "real sleeps without a reason (add `# real: <why>` in the function, or a module "
        "REAL_TIME string, or move the test to on_virtual_time): " + ", ".join(unexplained)
    )


def test_the_scan_sees_a_sleep_without_a_reason(tmp_path: Path) -> None:
    bare = tmp_path / "test_bare.py"
    bare.write_text(
        "import asyncio, time\n"
        "async def test_a():\n    await asyncio.sleep(0.2)\n"
        "def test_b():\n    time.sleep(1)\n"
        "async def test_c():\n    await asyncio.sleep(0)\n",
        encoding="utf-8",
    )
    explained = tmp_path / "test_explained.py"
    explained.write_text(
        "import asyncio\n"
        "async def test_a():  # real: a child process\n    await asyncio.sleep(0.2)\n"
        "@on_virtual_time\nasync def test_b():\n    await asyncio.sleep(5)\n",
        encoding="utf-8",
    )
    module = tmp_path / "test_module.py"
    module.write_text(
        'import time\nREAL_TIME = "a socket to redis-server"\ndef test_a():\n    time.sleep(1)\n',
        encoding="utf-8",
    )
    assert _unexplained(bare, tmp_path) == ["test_bare.py:3", "test_bare.py:5"]
    assert _unexplained(explained, tmp_path) == []
    assert _unexplained(module, tmp_path) == []
