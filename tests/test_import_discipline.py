"""Start-up stays cheap: `ai-lease --help` and `import ai_lease` import no heavy dependency.

Each check runs a fresh interpreter and looks at ``sys.modules`` afterwards (not at a clock,
so load on the machine cannot make it flaky).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import ai_lease

# What `--help` must not pay for: pydantic-settings' sources, Jinja2, the metrics HTTP
# server, rich, the provider SDKs and HTTP clients, the dashboard's web stack (and the
# modules of ours that bring them).
HEAVY = (
    "pydantic_settings",
    "jinja2",
    "prometheus_client",
    "http.server",
    "rich",
    "openai",
    "httpx",
    "aiohttp",
    "redis",
    "ai_lease.settings",
    "ai_lease.run.runner",
    "ai_lease.providers",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "ai_lease.ui",
)

# Prints the heavy modules loaded by then, after whatever code comes first.
_REPORT = """
heavy = {heavy!r}
loaded = [m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy)]
print("imported:" + ",".join(sorted(loaded)))
"""

_HELP = """
import sys
from ai_lease.cli.app import main
try:
    main(sys.argv[1:], prog_name="ai-lease")
except SystemExit as exit:
    assert exit.code in (0, None), exit.code
"""


def _imported_by(code: str, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        input="",
    )
    last = done.stdout.splitlines()[-1]
    assert last.startswith("imported:"), done.stdout
    return [m for m in last.removeprefix("imported:").split(",") if m]


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["submit", "--help"],
        ["worker", "--help"],
        ["status", "--help"],
        ["ui", "--help"],
    ],
)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    """`ai-lease ... --help` loads no settings, templates, metrics server, console or SDK."""
    assert _imported_by(_HELP + _REPORT.format(heavy=HEAVY), *argv) == []


def test_import_ai_lease_is_lazy() -> None:
    """`import ai_lease` (and the errors) imports no heavy dependency until a name is used."""
    code = "import sys, ai_lease, ai_lease.errors\n" + _REPORT.format(heavy=HEAVY)
    assert _imported_by(code) == []


def _type_checking_names() -> dict[str, str]:
    """The names ``ai_lease/__init__.py`` imports under ``if TYPE_CHECKING:``, by module."""
    tree = ast.parse(Path(ai_lease.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for item in node.body:
                assert isinstance(item, ast.ImportFrom)
                found |= {a.name: "." * item.level + (item.module or "") for a in item.names}
    return found


def _absolute(modules: dict[str, str]) -> dict[str, str]:
    """Each module name made absolute: ``.errors`` and ``ai_lease.errors`` are one module."""
    return {name: importlib.util.resolve_name(m, "ai_lease") for name, m in modules.items()}


def test_lazy_names_match_the_typed_imports() -> None:
    """Each public name resolves at run time to what type checkers see: one table, no drift."""
    typed = _type_checking_names()
    assert _absolute(typed) == _absolute(ai_lease._LAZY)
    for name, module in typed.items():
        assert getattr(ai_lease, name) is getattr(importlib.import_module(module, "ai_lease"), name)
    eager = set(ai_lease.__all__) - set(typed) - {"__version__"}
    assert not eager, f"add {sorted(eager)} to _LAZY and the TYPE_CHECKING imports"
    assert set(ai_lease.__all__) <= set(dir(ai_lease))


def test_unknown_name_is_an_attribute_error() -> None:
    """A name ai_lease does not export is an AttributeError, as for any module."""
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = ai_lease.NoSuchThing  # type: ignore[attr-defined]


def _imported_modules(tree: ast.Module, package: str) -> set[str]:
    """Every module an ``import`` or ``from … import`` in ``tree`` names (relative ones
    resolved against ``package``), at any depth (function-local and TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_production_code_never_imports_the_testing_helpers() -> None:
    """No module under ai_lease/ outside ai_lease/testing/ imports ai_lease.testing."""
    root = Path(ai_lease.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent)
        if relative.parts[:2] == ("ai_lease", "testing"):
            continue
        package = ".".join(relative.with_suffix("").parts)
        if path.name != "__init__.py":
            package = package.rpartition(".")[0]
        names = _imported_modules(ast.parse(path.read_text(encoding="utf-8")), package)
        if any(n == "ai_lease.testing" or n.startswith("ai_lease.testing.") for n in names):
            offenders.append(str(relative))
    assert offenders == []
