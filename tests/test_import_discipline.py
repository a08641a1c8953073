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


# Each store's module and the client library of each other store: a PostgreSQL command does not
# pay for redis-py (with OpenTelemetry's SDK installed, redis-py imports it too), and so on.
_STORE_CLIENTS = {
    "ai_lease.stores.sqlite.store": ("redis", "psycopg", "psycopg_pool"),
    "ai_lease.stores.redis.store": ("psycopg", "psycopg_pool"),
    "ai_lease.stores.postgres.store": ("redis", "hiredis"),
}


@pytest.mark.parametrize("module", sorted(_STORE_CLIENTS))
def test_a_store_imports_no_other_stores_client(module: str) -> None:
    """Opening one kind of store loads no other store's client library."""
    code = f"import sys, {module}\n" + _REPORT.format(heavy=_STORE_CLIENTS[module])
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


# What `ai-lease ls` on a SQLite store, with settings only for the store and the lease, must
# not pay for: the settings stack itself (pydantic, pydantic-settings), and what the other
# commands and stores need.
LOOK_HEAVY = (
    *HEAVY,
    "pydantic",
    "pydantic_core",
    "ai_lease.settings_provider",
    "ai_lease.run",
    "ai_lease.observe.metrics",
    "psycopg",
    "psycopg_pool",
    "ai_lease.cli.run_cmds",
    "ai_lease.cli.worker_cmd",
    "ai_lease.cli.ui_cmd",
    "ai_lease.cli.admin_cmds",
)

_FILL = """
import asyncio
from ai_lease import Job, connect

async def fill():
    async with connect("sqlite:///.ai-lease/ai-lease.db", provider=None) as client:
        for n in range(3):
            await client.submit(Job(f"job-{n}", input="x", prompt_text="{{ input }}"))

asyncio.run(fill())
"""


def _ls_imports(where: Path, env: dict[str, str]) -> list[str]:
    code = _HELP + _REPORT.format(heavy=LOOK_HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code, "ls"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        input="",
        cwd=where,
        env=env,
    )
    assert "job-2" in done.stdout, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    return [m for m in last.removeprefix("imported:").split(",") if m]


def test_ls_imports_no_settings_stack(tmp_path: Path) -> None:
    """`ai-lease ls` on SQLite, store and lease set by file and environment, lists its jobs
    without pydantic(-settings), Jinja2, providers, the runner or other stores' clients."""
    import os

    subprocess.run([sys.executable, "-c", _FILL], cwd=tmp_path, check=True, timeout=60)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "ai-lease.toml").write_text(
        '[store]\nnamespace = "ai_lease"\n[lease]\nrenew_interval = 4\n', encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AI_LEASE_")}
    env["AI_LEASE_STORE__OP_TIMEOUT"] = "1.5"
    assert _ls_imports(tmp_path, env) == []
    # Another section set: the whole settings read it (the same errors, the old cost).
    env["AI_LEASE_STREAM__IDLE"] = "20"
    assert "pydantic_settings" in _ls_imports(tmp_path, env)


def test_every_command_is_found_by_its_module() -> None:
    """The table the CLI loads commands by names each module's COMMANDS, and no others."""
    from ai_lease.cli.app import COMMAND_MODULES

    modules = {f"ai_lease.cli.{m}" for m in COMMAND_MODULES.values()}
    found = {
        command.name: module.rpartition(".")[2]
        for module in sorted(modules)
        for command in importlib.import_module(module).COMMANDS
    }
    assert found == COMMAND_MODULES
    cli = Path(ai_lease.__file__).parent / "cli"
    with_commands = {p.stem for p in cli.glob("*.py") if "\nCOMMANDS = " in p.read_text("utf-8")}
    assert with_commands == set(COMMAND_MODULES.values())
