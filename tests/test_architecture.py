"""The package's structure, held to what docs/architecture.md says of it.

An import graph of ``ai_lease/`` read with :mod:`ast` (standard library only): every
``import`` and ``from … import`` of the package, anywhere in a file — top level, inside a
function, under ``if TYPE_CHECKING:`` (a type-only import is still an arrow on paper). A
``from pkg import name`` where ``name`` is a module of ``pkg`` is an arrow to that module,
otherwise to the package's ``__init__``. Run it alone with
``python -m pytest tests/test_architecture.py``.

The rules: no circle of imports; ``lease/`` (the protocols and the rules) imports nothing
above it; only the CLI imports the CLI; no module over 450 lines, no function over 60; the
"Rooms" table of docs/architecture.md names every module, and nothing else.
(Production code never importing ``ai_lease.testing`` is tests/test_import_discipline.py's.)
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ai_lease"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

# What the lease room may not import: everything that sits above it.
ABOVE_LEASE = (
    "ai_lease.run",
    "ai_lease.observe",
    "ai_lease.cli",
    "ai_lease.ui",
    "ai_lease.client",
    "ai_lease.sync_client",
    "ai_lease.settings",
    "ai_lease.providers",
    "ai_lease.stores",
    "ai_lease.testing",
)

Arrows = dict[str, dict[str, set[str]]]  # module -> imported module -> names taken


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def arrows(package: Path) -> Arrows:
    """Who imports whom inside ``package``, with the names each import takes."""
    known = modules(package)
    root = package.name
    graph: Arrows = {name: {} for name in known}
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, taken in _imports(ast.parse(path.read_text(encoding="utf-8")), here):
            if target != root and not target.startswith(root + "."):
                continue
            module = _resolve(target, known)
            for item in taken or ["*"]:
                sub = f"{target}.{item}"
                found = sub if sub in known else module
                if found is not None and found != name:
                    graph[name].setdefault(found, set()).add(item)
    return graph


def _imports(tree: ast.AST, here: str) -> Iterator[tuple[str, list[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            yield base, [alias.name for alias in node.names]


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def circles(graph: Arrows) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: Arrows, circle: list[str]) -> str:
    ties = [
        f"  {a} -> {b}: {', '.join(sorted(graph[a][b]))}"
        for a in circle
        for b in sorted(graph[a])
        if b in circle
    ]
    return f"circle of {len(circle)}:\n" + "\n".join(ties)


def _inside(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".") or name.startswith(prefix + "_")


# -- the rules, on the package ------------------------------------------------------------------


def test_no_import_circles() -> None:
    graph = arrows(PACKAGE)
    found = circles(graph)
    assert not found, "\n".join(_describe(graph, circle) for circle in found)


def test_lease_imports_nothing_above_it() -> None:
    graph = arrows(PACKAGE)
    wrong = [
        f"{a} -> {b}: {', '.join(sorted(names))}"
        for a, targets in graph.items()
        if _inside(a, "ai_lease.lease")
        for b, names in targets.items()
        if any(_inside(b, above) for above in ABOVE_LEASE)
    ]
    assert not wrong, "lease/ imports from above it:\n" + "\n".join(wrong)


def test_only_the_cli_imports_the_cli() -> None:
    graph = arrows(PACKAGE)
    wrong = [
        f"{a} -> {b}"
        for a, targets in graph.items()
        if not _inside(a, "ai_lease.cli") and a != "ai_lease.__main__"
        for b in targets
        if _inside(b, "ai_lease.cli")
    ]
    assert not wrong, "outside cli/, these import the CLI:\n" + "\n".join(wrong)


def test_modules_and_functions_stay_short() -> None:
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            long_modules.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert not long_modules, f"over {MAX_MODULE_LINES} lines:\n" + "\n".join(long_modules)
    assert not long_functions, f"over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long_functions)


# -- the rooms table ---------------------------------------------------------------------------


def rooms_table(text: str) -> set[str]:
    """The module paths (relative to ai_lease/) the "## Rooms" table names: a row's room
    that starts with a folder in backticks (`` `stores/redis/` — …``) holds its modules by
    file name; a row without one names them by their path under ai_lease/."""
    section = ("\n" + text).split("\n## Rooms\n", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("room", "") or set(cells[0]) <= {"-"}:
            continue
        folder = re.match(r"`([\w/]+/)`", cells[0])
        for name in re.findall(r"`([\w/.]+\.py)`", cells[1]):
            named.add((folder[1] if folder else "") + name)
    return named


def test_the_rooms_table_names_every_module() -> None:
    named = rooms_table(ARCHITECTURE.read_text(encoding="utf-8"))
    actual = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")}
    missing, stale = sorted(actual - named), sorted(named - actual)
    assert not missing, "docs/architecture.md's Rooms table misses: " + ", ".join(missing)
    assert not stale, "docs/architecture.md's Rooms table names what is gone: " + ", ".join(stale)


# -- the checks themselves, on a small made-up package -------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = tmp_path / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path / "pkg"


def test_the_graph_finds_a_circle_a_type_only_import_closes(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import thing\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
            "c.py": "def f():\n    from .a import x\n",
        },
    )
    graph = arrows(package)
    assert graph["pkg.a"] == {"pkg.b": {"thing"}}
    assert graph["pkg.b"] == {"pkg.a": {"a"}}  # a submodule named in a from-import
    assert graph["pkg.c"] == {"pkg.a": {"x"}}  # relative, inside a function
    assert circles(graph) == [["pkg.a", "pkg.b"]]
    assert "pkg.a -> pkg.b: thing" in _describe(graph, ["pkg.a", "pkg.b"])


def test_the_graph_sees_no_circle_where_arrows_run_one_way(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {"__init__.py": "", "a.py": "import pkg.b\n", "b.py": "import os\nfrom pkg import c\n"},
    )
    package.joinpath("c.py").write_text("X = 1\n", encoding="utf-8")
    graph = arrows(package)
    assert graph["pkg.a"] == {"pkg.b": {"*"}} and graph["pkg.b"] == {"pkg.c": {"c"}}
    assert circles(graph) == []


def test_the_table_reader_follows_both_conventions() -> None:
    text = (
        "## Rooms\n\n| room | modules | what |\n|---|---|---|\n"
        "| front | `client.py`, `lease/base.py` | x |\n"
        "| `stores/redis/` — the Redis store | `store.py` + `calls.py` | y |\n"
        "| `ui/` | `app.py`, `templates/` | z |\n\n## Next\n| a | `nope.py` | b |\n"
    )
    assert rooms_table(text) == {
        "client.py",
        "lease/base.py",
        "stores/redis/store.py",
        "stores/redis/calls.py",
        "ui/app.py",
    }
