"""The package's structure, held to what docs/architecture.md says of it.

An import graph of ``ai_lease/`` read with :mod:`ast` and :mod:`pathlib` only. Each ``.py``
file is a module named by its path (``ai_lease/run/runner.py`` is ``ai_lease.run.runner``,
a package is its ``__init__.py``). Every ``import`` and ``from … import`` of the package is
an arrow, wherever it stands: top level, inside a function, under ``if TYPE_CHECKING:`` (a
type-only import is still an arrow). ``from pkg import name`` where ``name`` is a module of
``pkg`` is an arrow to that module, otherwise to ``pkg/__init__.py`` (even when that
``__init__`` only re-exports); ``import pkg.mod`` is an arrow to ``pkg.mod`` only, not to its
parents. Strings are not arrows: the front door's lazy table of names → module strings
(PEP 562 ``__getattr__``) adds none, its ``if TYPE_CHECKING:`` imports do.

The rules: no circle of imports; no arrow runs from a lower floor to a higher one (``FLOORS``,
the one statement of the order; ``lease/`` importing nothing above it is the same rule, said
on its own); only the CLI imports the CLI; cli/ and ui/ import no store and no runner, and read
no ``.store`` off a Client (an :mod:`ast` walk); no module over 450 lines (no function over
60); the "Rooms" table of docs/architecture.md names every module and nothing else. That
production code never imports ``ai_lease.testing`` is checked by
tests/test_import_discipline.py (not repeated here).

Run it alone with ``python -m pytest tests/test_architecture.py``.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ai_lease"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60

# The floors, from the ground up, as docs/architecture.md states them: a module imports only
# from its own floor and the floors below. An entry is a module and everything under it
# (``ai_lease`` itself is only the package's __init__.py); one ending in ``_`` is a family of
# top-level modules by prefix (ai_lease.settings_sources, ai_lease.settings_ui, …).
FLOORS: tuple[tuple[str, ...], ...] = (
    (  # the values and the edge
        "ai_lease.job",
        "ai_lease.job_fields",
        "ai_lease.job_shapes",
        "ai_lease.job_provider",
        "ai_lease.timeouts",
        "ai_lease.retry",
        "ai_lease.errors",
        "ai_lease.refusal",
        "ai_lease.failure",
        "ai_lease.text_safety",
        "ai_lease.resource",
        "ai_lease.inputs",
        "ai_lease.prompts",
        "ai_lease.redaction",
    ),
    ("ai_lease.lease",),
    ("ai_lease.providers", "ai_lease.stores", "ai_lease.observe"),
    ("ai_lease.run",),
    ("ai_lease.settings", "ai_lease.settings_"),
    (
        "ai_lease",
        "ai_lease.client",
        "ai_lease.client_parts",
        "ai_lease.sync_client",
    ),  # the front door
    ("ai_lease.cli", "ai_lease.ui", "ai_lease.__main__"),
    ("ai_lease.testing",),  # shipped for third parties; production code never imports it
)


@dataclass
class Arrow:
    """One module's imports of another: the names taken and where."""

    names: set[str] = field(default_factory=set)
    lines: set[int] = field(default_factory=set)
    type_only: bool = True  # every one of them under `if TYPE_CHECKING:`


@dataclass
class Graph:
    files: dict[str, Path]  # module -> its file
    arrows: dict[str, dict[str, Arrow]]  # module -> imported module -> the arrow
    root: Path  # the folder that holds the package (file names are shown relative to it)

    def file(self, module: str) -> str:
        return self.files[module].relative_to(self.root).as_posix()

    def describe(self, source: str, target: str) -> str:
        arrow = self.arrows[source][target]
        lines = ", ".join(str(n) for n in sorted(arrow.lines))
        where = f"line {lines}" if len(arrow.lines) == 1 else f"lines {lines}"
        kind = "; type-only" if arrow.type_only else ""
        return (
            f"{self.file(source)} -> {self.file(target)}: "
            f"{', '.join(sorted(arrow.names))} ({where}{kind})"
        )


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@dataclass
class Source:
    """One file read once: its text, its imports (with whether each stands under
    ``if TYPE_CHECKING:``) and its functions (name, first line, length in lines)."""

    text: str
    imports: list[tuple[ast.Import | ast.ImportFrom, bool]]
    functions: list[tuple[str, int, int]]


@functools.cache
def read(path: Path) -> Source:
    text = path.read_text(encoding="utf-8")
    typed: set[int] = set()
    imports, functions = [], []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                typed |= {id(n) for n in ast.walk(statement)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            imports.append(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            functions.append((node.name, node.lineno, length))
    return Source(text, [(node, id(node) in typed) for node in imports], functions)


def _nearest(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def build_graph(package: Path) -> Graph:
    """Who imports whom inside ``package``, with the names each import takes."""
    known = modules(package)
    top = package.name
    graph = Graph(known, {name: {} for name in known}, package.parent)
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, type_only in read(path).imports:
            taken: list[tuple[str, str]] = []  # (target module, name shown)
            if isinstance(node, ast.Import):
                taken = [(alias.name, f"import {alias.name}") for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join([*parts, *([base] if base else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    taken.append((sub if sub in known else base, alias.name))
            for target, shown in taken:
                if target != top and not target.startswith(top + "."):
                    continue
                found = _nearest(target, known)
                if found is None:
                    continue
                arrow = graph.arrows[name].setdefault(found, Arrow())
                arrow.names.add(shown)
                arrow.lines.add(node.lineno)
                arrow.type_only = arrow.type_only and type_only
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules that import
    themselves (Tarjan, iterative), each sorted, in a stable order."""
    edges = {name: sorted(targets) for name, targets in graph.arrows.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(edges[start]))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
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
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


def describe_circle(graph: Graph, circle: list[str]) -> str:
    members = set(circle)
    arrows = [
        "  " + graph.describe(a, b) for a in circle for b in sorted(graph.arrows[a]) if b in members
    ]
    return f"a circle of {len(circle)} module(s):\n" + "\n".join(arrows)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _on(name: str, entry: str) -> bool:
    if entry.endswith("_"):
        return name.startswith(entry)
    return name == entry or ("." in entry and name.startswith(entry + "."))


def floor_of(name: str, floors: tuple[tuple[str, ...], ...] = FLOORS) -> int | None:
    """The floor (0: the ground) of module ``name``: its longest entry's; None if on none."""
    found = [(len(e), i) for i, entries in enumerate(floors) for e in entries if _on(name, e)]
    return max(found)[1] if found else None


def upward(graph: Graph, floors: tuple[tuple[str, ...], ...] = FLOORS) -> list[str]:
    """The arrows that run from a lower floor to a higher one."""
    return [
        f"{graph.describe(a, b)} [floor {floor_of(a, floors)} -> {floor_of(b, floors)}]"
        for a in sorted(graph.arrows)
        for b in sorted(graph.arrows[a])
        if (floor_of(b, floors) or 0) > (floor_of(a, floors) or 0)
    ]


def _above_lease(name: str) -> bool:
    floor = floor_of(name)
    return floor is not None and floor > FLOORS.index(("ai_lease.lease",))


def forbidden(graph: Graph, inside: str, allowed, wrong) -> list[str]:
    """The arrows from modules ``inside`` (a package) that land on a ``wrong`` module, unless
    the source is ``allowed``."""
    return [
        graph.describe(a, b)
        for a in sorted(graph.arrows)
        if (inside == "" or _under(a, inside)) and not allowed(a)
        for b in sorted(graph.arrows[a])
        if wrong(b)
    ]


@functools.cache
def _package_graph() -> Graph:
    return build_graph(PACKAGE)


# -- the rules, on the package ------------------------------------------------------------------


def test_no_import_circles() -> None:
    graph = _package_graph()
    found = circles(graph)
    assert not found, f"{len(found)} import circle(s):\n" + "\n".join(
        describe_circle(graph, c) for c in found
    )


def test_lease_imports_nothing_above_it() -> None:
    wrong = forbidden(_package_graph(), "ai_lease.lease", lambda a: False, _above_lease)
    assert not wrong, f"lease/ imports from above it ({len(wrong)} arrows):\n" + "\n".join(wrong)


def test_every_module_stands_on_a_floor() -> None:
    lost = sorted(m for m in _package_graph().files if floor_of(m) is None)
    assert not lost, f"modules on no floor of FLOORS ({len(lost)}): {', '.join(lost)}"


def test_no_arrow_runs_back_up() -> None:
    wrong = upward(_package_graph())
    assert not wrong, f"arrows from a lower floor to a higher one ({len(wrong)}):\n" + "\n".join(
        wrong
    )


def test_only_the_cli_imports_the_cli() -> None:
    wrong = forbidden(
        _package_graph(),
        "",
        lambda a: _under(a, "ai_lease.cli") or a == "ai_lease.__main__",
        lambda b: _under(b, "ai_lease.cli"),
    )
    assert not wrong, f"outside cli/, these import the CLI ({len(wrong)}):\n" + "\n".join(wrong)


# What the CLI and the dashboard reach only through the front door (ai_lease.client): the
# stores and the machinery that runs jobs. Value types (job, errors) and the lease
# protocols stay theirs to import.
BEHIND_THE_CLIENT = ("stores", "run.runner", "run.worker", "run.attempt")
FRONT_DOOR_USERS = ("cli", "ui")


def behind_the_client(graph: Graph, root: str) -> list[str]:
    """The arrows from ``root``'s cli/ and ui/ to a store or to the runner, worker or
    attempt modules, which only ``root.client`` may import for them."""

    def wrong(name: str) -> bool:
        return any(_under(name, f"{root}.{part}") for part in BEHIND_THE_CLIENT)

    return [
        arrow
        for user in FRONT_DOOR_USERS
        for arrow in forbidden(graph, f"{root}.{user}", lambda a: False, wrong)
    ]


def test_the_cli_and_the_dashboard_go_through_the_client() -> None:
    wrong = behind_the_client(_package_graph(), "ai_lease")
    assert not wrong, (
        f"cli/ or ui/ import a store or the runner/worker themselves ({len(wrong)} arrows; "
        "use ai_lease.client):\n" + "\n".join(wrong)
    )


# ... and that they do not reach past a Client to its store: no `.store` attribute in cli/
# or ui/ but a settings section (`settings.store`, where the store is, not the store).
# One exception, said in its own words.
STORE_REACH_ALLOWED = {
    "cli/demo.py": "the demo's woken zombie writes its late result to the store itself, to "
    "show the fence refuse it; its stage reads the record through StageContext.store",
}


def store_reaches(package: Path, allowed: dict[str, str]) -> list[str]:
    """Each ``x.store`` in ``package``'s cli/ and ui/ modules not listed in ``allowed``,
    except ``settings.store`` (or ``….settings.store``); as ``path:line: x.store``."""
    found = []
    for user in FRONT_DOOR_USERS:
        for path in sorted((package / user).rglob("*.py")):
            relative = path.relative_to(package).as_posix()
            if relative in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Attribute) or node.attr != "store":
                    continue
                if _named(node.value) == "settings":
                    continue
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    return found


def _named(node: ast.expr) -> str | None:
    """The last name of ``x`` or ``a.b.x`` (None for a call or anything else)."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def test_the_cli_and_the_dashboard_never_reach_past_the_client() -> None:
    wrong = store_reaches(PACKAGE, STORE_REACH_ALLOWED)
    assert not wrong, (
        f"cli/ or ui/ reach past a Client to its store ({len(wrong)}; add a Client method "
        "instead):\n" + "\n".join(wrong)
    )
    assert all((PACKAGE / listed).is_file() for listed in STORE_REACH_ALLOWED)


# That production code never imports ai_lease.testing is tests/test_import_discipline.py's
# test_production_code_never_imports_the_testing_helpers.


def _sources() -> list[tuple[str, Source]]:
    return [
        (path.relative_to(ROOT).as_posix(), read(path)) for path in sorted(PACKAGE.rglob("*.py"))
    ]


def test_modules_are_at_most_450_lines() -> None:
    long = [
        f"{where}: {lines} lines"
        for where, source in _sources()
        if (lines := len(source.text.splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"{len(long)} module(s) over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_functions_are_at_most_60_lines() -> None:
    long = [
        f"{where}:{line} {name}: {length} lines"
        for where, source in _sources()
        for name, line, length in sorted(source.functions, key=lambda f: f[1])
        if length > MAX_FUNCTION_LINES
    ]
    assert not long, f"{len(long)} function(s) over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# -- the rooms table ---------------------------------------------------------------------------


def rooms_table(text: str) -> list[str]:
    """What the "## Rooms" table's modules column names, as paths under ai_lease/ (a folder
    keeps its trailing ``/``), in table order, repeats kept.

    The convention: each entry is in backticks. An entry with a ``/`` inside it
    (``cli/ui_cmd.py``) is its path under ai_lease/; a bare file name (``base.py``) or folder
    (``templates/``) lies in the room's folder: the folder in backticks at the start of the
    room column (``lease/`` in "`lease/` — leases, renewal, fencing"), ai_lease/ itself when
    the room names none. Anything else in the cell (words, ``+``, parentheses) is prose.
    """
    section = ("\n" + text).split("\n## Rooms\n", 1)[1].split("\n## ", 1)[0]
    named: list[str] = []
    for line in section.splitlines():
        if not line.lstrip().startswith("|"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] == "room" or set(cells[0]) <= {"-", ":"}:
            continue
        folder = re.match(r"`([\w/]+/)`", cells[0])
        for entry in re.findall(r"`([^`]+)`", cells[1]):
            inner = entry.rstrip("/")
            named.append(entry if "/" in inner else (folder[1] if folder else "") + entry)
    return named


def rooms_problems(named: list[str], package: Path) -> list[str]:
    """What is wrong with the table's names against the files of ``package``."""
    actual = {p.relative_to(package).as_posix() for p in package.rglob("*.py")}
    problems = []
    if missing := sorted(actual - set(named)):
        problems.append(f"not named ({len(missing)}): " + ", ".join(missing))
    modules = [n for n in named if n.endswith(".py")]
    folders = [n for n in named if n.endswith("/")]
    other = [n for n in named if n not in modules and n not in folders]
    gone = sorted(
        {n for n in modules if n not in actual} | {n for n in folders if not (package / n).is_dir()}
    )
    if gone:
        problems.append(f"named but not there ({len(gone)}): " + ", ".join(gone))
    if twice := sorted({n for n in named if named.count(n) > 1}):
        problems.append(f"named twice: {', '.join(twice)}")
    if other:
        problems.append(f"neither a .py file nor a folder/: {', '.join(other)}")
    return problems


def test_the_rooms_table_names_every_module() -> None:
    problems = rooms_problems(rooms_table(ARCHITECTURE.read_text(encoding="utf-8")), PACKAGE)
    assert not problems, (
        "docs/architecture.md's Rooms table (paths under ai_lease/):\n" + "\n".join(problems)
    )


# -- the checks themselves, on a small made-up package ------------------------------------------


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
            "a.py": "from pkg.b import thing, other\n",
            "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
            "c.py": "def f():\n    from .a import x\n",
            "d.py": "import pkg.d\n",
        },
    )
    graph = build_graph(package)
    assert graph.arrows["pkg.a"].keys() == {"pkg.b"}
    assert graph.arrows["pkg.b"]["pkg.a"].names == {"a"}  # a submodule named in a from-import
    assert graph.arrows["pkg.b"]["pkg.a"].type_only
    assert graph.arrows["pkg.c"]["pkg.a"].names == {"x"}  # relative, inside a function
    assert not graph.arrows["pkg.c"]["pkg.a"].type_only
    assert circles(graph) == [["pkg.a", "pkg.b"], ["pkg.d"]]  # a self-import is a circle too
    text = describe_circle(graph, ["pkg.a", "pkg.b"])
    assert "pkg/a.py -> pkg/b.py: other, thing (line 1)" in text
    assert "pkg/b.py -> pkg/a.py: a (line 3; type-only)" in text


def test_the_graph_sees_no_circle_where_arrows_run_one_way(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "from typing import TYPE_CHECKING\n"
            "_LAZY = {'thing': 'pkg.a'}\n"  # a string table is not an arrow
            "def __getattr__(name):\n"
            "    import importlib\n"
            "    return importlib.import_module(_LAZY[name])\n",
            "a.py": "import pkg.b\nimport os\n",
            "b.py": "from pkg import c, VALUE\n",  # a module of pkg, and a name of its __init__
            "c.py": "X = 1\n",
        },
    )
    graph = build_graph(package)
    assert graph.arrows["pkg"] == {}
    assert graph.arrows["pkg.a"].keys() == {"pkg.b"}
    assert graph.arrows["pkg.b"].keys() == {"pkg.c", "pkg"}
    assert circles(graph) == []


def test_a_forbidden_arrow_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "lease/__init__.py": "",
            "lease/base.py": "def f():\n    from ..run import runner\n",
            "lease/rules.py": "from . import base\n",
            "run/__init__.py": "",
            "run/runner.py": "from pkg.lease import base\n",
        },
    )
    graph = build_graph(package)
    wrong = forbidden(graph, "pkg.lease", lambda a: False, lambda b: _under(b, "pkg.run"))
    assert wrong == ["pkg/lease/base.py -> pkg/run/runner.py: runner (line 2)"]
    assert _above_lease("ai_lease.settings_ui") and _above_lease("ai_lease.run.runner")
    assert not _above_lease("ai_lease.lease.base") and not _above_lease("ai_lease.runner")


def test_an_arrow_back_up_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "from pkg.lease.refusal import Refusal\n",
            "lease/__init__.py": "",
            "lease/refusal.py": "",
            "lease/base.py": "from pkg import errors\n",
            "run/runner.py": "from pkg.lease import base\nfrom pkg import errors\n",
        },
    )
    floors = (("pkg.errors",), ("pkg.lease",), ("pkg.run",), ("pkg",))
    assert [floor_of(m, floors) for m in ("pkg.errors", "pkg.lease.base", "pkg.run.runner")] == [
        0,
        1,
        2,
    ]
    assert floor_of("pkg", floors) == 3 and floor_of("pkg.other", floors) is None
    assert upward(build_graph(package), floors) == [
        "pkg/errors.py -> pkg/lease/refusal.py: Refusal (line 1) [floor 0 -> 1]"
    ]


def test_an_arrow_around_the_client_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "client.py": "from pkg.stores import sqlite\nfrom pkg.run import runner\n",
            "cli/__init__.py": "",
            "cli/ok.py": "from pkg import client\nfrom pkg.run import config\n",
            "cli/bad.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.run.worker import Worker\n"
            ),
            "ui/__init__.py": "",
            "ui/views.py": "def f():\n    from ..stores import sqlite\n",
            "run/__init__.py": "",
            "run/config.py": "",
            "run/runner.py": "",
            "run/worker.py": "",
            "stores/__init__.py": "",
            "stores/sqlite.py": "",
        },
    )
    wrong = behind_the_client(build_graph(package), "pkg")
    assert wrong == [
        "pkg/cli/bad.py -> pkg/run/worker.py: Worker (line 3; type-only)",
        "pkg/ui/views.py -> pkg/stores/sqlite.py: sqlite (line 2)",
    ]


def test_a_reach_past_the_client_is_found(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "cli/ok.py": (
                "url = obj.settings.store.url\nwhere = settings.store\nrows = await client.list()\n"
            ),
            "cli/bad.py": "async def f(client):\n    return await client.store.get('k')\n",
            "cli/listed.py": "store = opened.store\n",
            "ui/views.py": "job = await ui_of(request).store.get(key)\n",
            "run/runner.py": "store = self.store\n",
        },
    )
    wrong = store_reaches(package, {"cli/listed.py": "a reason"})
    assert wrong == ["cli/bad.py:2: client.store", "ui/views.py:1: ui_of(request).store"]


def test_the_table_reader_follows_the_convention(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "client.py": "",
            "lease/base.py": "",
            "ui/app.py": "",
            "cli/ui_cmd.py": "",
            "cli/extra.py": "",
        },
    )
    (package / "ui" / "templates").mkdir()
    text = (
        "## Rooms\n\n| room | modules | what |\n|---|---|---|\n"
        "| the front door | `__init__.py`, `client.py`, `lease/base.py` | x |\n"
        "| `ui/` — the dashboard (the `ui` extra) | `app.py` + `cli/ui_cmd.py` (+ its"
        " helpers), `templates/`, `static/` | `not_a_module.py` |\n"
        "| `cli/` | `ui_cmd.py`, `gone.py`, `cli.main` | z |\n\n## Next\n| a | `nope.py` | b |\n"
    )
    named = rooms_table(text)
    assert named == [
        "__init__.py",
        "client.py",
        "lease/base.py",
        "ui/app.py",
        "cli/ui_cmd.py",
        "ui/templates/",
        "ui/static/",
        "cli/ui_cmd.py",
        "cli/gone.py",
        "cli/cli.main",
    ]
    assert rooms_problems(named, package) == [
        "not named (1): cli/extra.py",
        "named but not there (2): cli/gone.py, ui/static/",
        "named twice: cli/ui_cmd.py",
        "neither a .py file nor a folder/: cli/cli.main",
    ]
