"""Every ```python and ```sh block of README.md and docs/*.md runs as written.

Each block runs in a fresh temporary directory with the installed package (Python blocks in a
subprocess of this interpreter, shell blocks through ``bash -e`` with ``ai-lease`` on PATH)
and must end with its expected exit code (0 unless the table says otherwise); a block that
fails names its file and line. What a block says is the user's own (``score()``, ``db``, a
``job.toml``, a model server at some address) comes from the small prelude keyed below by the
block's first line; the only edits to a block's text are the substitutions listed with it
(a server URL → the test's own real server, a fixed port → a free one, a placeholder key).
A block marked ``<!-- not run: REASON -->`` right above its fence is counted, not run: the
CLI synopsis, the suite itself, and the benchmarks (minutes of full load each — for those the
script and every option they name must exist).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.checkout import checkout_copy
from tests.harness.doc_blocks import (
    ROOT,
    Block,
    clean_env,
    doc_blocks,
    run_bash,
    serve_then_interrupt,
)
from tests.harness.pg_server import PostgresServer
from tests.harness.redis_server import RedisServer, free_port
from tests.harness.sse_server import SSEServer, chat_chunks, sse

pytestmark = pytest.mark.timeout(600)

BLOCKS = doc_blocks()
RUN = [b for b in BLOCKS if b.not_run is None]
NOT_RUN = [b for b in BLOCKS if b.not_run is not None]
MAX_NOT_RUN_OTHER_THAN_BENCHMARKS = 3  # keep these few: a block that is not run can rot

# -- what a Python block says is the user's own ------------------------------------------------

_SQLITE = 'url = "sqlite:///.ai-lease/ai-lease.db"\n'
_PROVIDER = (
    "from ai_lease.providers import create_provider\n"
    'provider = create_provider("local-extractive")\n'
)

PY_PRELUDE: dict[str, str] = {
    # README "A lease around your own code": the batches, load() and the model call are yours.
    "async def nightly_report(": (
        "import asyncio\nimport ai_lease\n"
        "async def load(batch): await asyncio.sleep(0)\n"
        "async def my_model_call(on_chunk):\n"
        "    for c in ('an ', 'answer'): on_chunk(c)\n"
        "    return 'an answer'\n"
    ),
    # README "Your own stages": score() is yours.
    "async def enrich(": "async def score(row):\n    return len(row['line'])\n",
    # README "Guard your own writes": db is yours (here: it records the statement).
    "async def save_to_my_db(": (
        "class _DB:\n    seen = []\n"
        "    async def execute(self, sql, params): self.seen.append(params)\n"
        "db = _DB()\n"
    ),
    # docs/observability.md: the store URL and the provider are yours.
    "import prometheus_client": _SQLITE + _PROVIDER,
    "from ai_lease.observe.store_metrics import": (
        "import asyncio\nfrom ai_lease import Metrics, open_store\n"
    ),
    "import logging": _PROVIDER
    + "from ai_lease import open_store\nstore = open_store('sqlite:///jobs.db')\n",
}
PY_EPILOGUE: dict[str, str] = {
    "async def nightly_report(": (
        "async def _main():\n"
        "    async with ai_lease.connect('sqlite:///.ai-lease/ai-lease.db') as client:\n"
        "        assert await nightly_report(client, ['a', 'b']) == 'an answer'\n"
        "        assert await nightly_report(client, ['a', 'b']) == 'an answer'  # done\n"
        "asyncio.run(_main())\n"
    ),
    "async def save_to_my_db(": (
        "import asyncio, ai_lease\nfrom ai_lease import Job\n"
        "async def _main():\n"
        "    async with ai_lease.connect('sqlite:///j.db', persist_hook=save_to_my_db) as c:\n"
        "        record = await c.run(Job('report-7', input='One. Two.'))\n"
        "    assert db.seen == [{'body': record.output, 'token': record.token, 'id': 'report-7'}]\n"
        "asyncio.run(_main())\n"
    ),
    "import prometheus_client": "server.close()\n",
    "from ai_lease.observe.store_metrics import": (
        "async def _main():\n    store = open_store('sqlite:///jobs.db')\n"
        "    await serve(store, Metrics())\n    await store.aclose()\n"
        "asyncio.run(_main())\n"
    ),
}
PY_SUBSTITUTE: dict[str, dict[str, str]] = {
    "import prometheus_client": {"9109": "{port}"},  # a fixed port → a free one
}

# -- what a shell block says is the user's own -------------------------------------------------

JOB_TOML = """cat > job.toml <<'TOML'
key = "report-42"
input = "Long text. To summarise. Today."
prompt = "summarize"
TOML
"""


@dataclass(frozen=True)
class Shell:
    prelude: str = ""  # run first (a bash of its own: the state the block assumes)
    env: dict[str, str] = field(default_factory=dict)  # what the user's shell has set
    substitute: dict[str, str] = field(default_factory=dict)  # {placeholder} filled in below
    expect: int = 0
    checkout: bool = False  # runs in a copy of the repository (its install commands)
    server: str | None = None  # "redis", "postgres" or "model": the test's own real one
    # a line that serves until Ctrl-C: its prefix → (when it is ready, its exit after Ctrl-C)
    serve: dict[str, tuple[str, int]] = field(default_factory=dict)


_VENV = "[ -x .venv/bin/ai-lease ] || (python3 -m venv .venv && .venv/bin/pip install -q -e .)\n"

SHELL: dict[str, Shell] = {
    # README "Two commands": in a copy of the checkout, as a new clone would be.
    "python3 -m venv .venv": Shell(checkout=True),
    ".venv/bin/ai-lease demo": Shell(
        prelude=_VENV,
        checkout=True,
        # "here Ctrl-C is the way out, not an error"
        serve={".venv/bin/pip install -q -e '.[ui]'": ("the timeline stays at", 0)},
    ),
    # README CLI examples: the keys they name exist in the states the comments assume.
    "ai-lease cancel report-42": Shell(
        prelude=JOB_TOML
        + "ai-lease submit job.toml --detach\n"  # report-42: PENDING
        + "ai-lease submit job.toml --key report-41 --detach\nai-lease cancel report-41\n"
        + "ai-lease submit job.toml --key report-40 --quiet\n"  # DONE
    ),
    "export OPENAI_API_KEY=": Shell(
        prelude=JOB_TOML,
        # the user's configured OpenAI endpoint (here the test's own server)
        env={"AI_LEASE_PROVIDER__NAME": "openai", "AI_LEASE_PROVIDER__BASE_URL": "{model_url}"},
        substitute={"sk-…": "sk-test"},
        server="model",
    ),
    "export AI_LEASE_PROVIDER__NAME=openai-compatible": Shell(
        prelude=JOB_TOML, substitute={"http://127.0.0.1:11434/v1": "{model_url}"}, server="model"
    ),
    # "the same store the CLI uses": the user's store, with a job in it, is theirs
    # (the default port 8377 → a free one, set as the user's shell may: no two blocks, nor
    # a run beside this one, share it)
    "ai-lease ui --host 0.0.0.0": Shell(
        prelude=JOB_TOML + "ai-lease submit job.toml --detach >/dev/null\n",
        env={"AI_LEASE_UI__PORT": "{port}"},
        serve={"ai-lease ui": ("http://127.0.0.1:{port}/healthz", 130)},  # Ctrl-C: 130
    ),
    # docs/architecture.md, behind a reverse proxy: the proxy's name is answered too
    "--allowed-host dash.example.com": Shell(
        prelude=JOB_TOML + "ai-lease submit job.toml --detach >/dev/null\n",
        substitute={"--port 8377": "--port {port}"},
        serve={"ai-lease ui": ("http://127.0.0.1:{port}/healthz", 130)},
    ),
    "export AI_LEASE_STORE__URL=redis://127.0.0.1:6379/0": Shell(
        prelude=JOB_TOML,
        substitute={
            "redis://127.0.0.1:6379/0": "{redis_url}",
            "ai-lease result KEY": "ai-lease result report-42",
            "ai-lease status KEY": "ai-lease status report-42",
        },
        server="redis",
    ),
    "export AI_LEASE_STORE__URL=redis://:password@": Shell(
        prelude=JOB_TOML,
        substitute={"redis://:password@redis.internal:6379/0": "{redis_url}"},
        server="redis",
    ),
    "pip install 'ai_lease[postgres]'": Shell(
        prelude=JOB_TOML,
        substitute={"postgresql://app@db.internal:5432/jobs?sslmode=verify-full": "{postgres_url}"},
        server="postgres",
    ),
    "ai-lease worker --metrics-port 9109": Shell(
        substitute={"9109": "{port}"},
        serve={"ai-lease worker": ("http://127.0.0.1:{port}/metrics", 0)},  # drained: 0
    ),
}


def _config_for(block: Block, table: dict[str, object]) -> str | None:
    """The table's key found in the block's text (the longest, if several are)."""
    hits = [key for key in table if key in block.text]
    return max(hits, key=len) if hits else None


# -- the tests -------------------------------------------------------------------------------


def test_the_docs_have_blocks_to_run() -> None:
    """The extractor finds the README's and docs' blocks (an empty list would pass vacuously)."""
    where = {b.where.split(":")[0] for b in RUN}
    assert {"README.md", "docs/observability.md"} <= where, where
    assert len(RUN) >= 15, [b.where for b in RUN]


def test_blocks_not_run_are_few_and_marked() -> None:
    """Only the synopsis-like blocks and the benchmarks carry `<!-- not run: … -->`."""
    others = [b for b in NOT_RUN if not b.not_run.startswith("benchmark")]  # type: ignore[union-attr]
    assert len(others) <= MAX_NOT_RUN_OTHER_THAN_BENCHMARKS, [(b.where, b.not_run) for b in others]
    benchmarks = [b for b in NOT_RUN if b not in others]
    assert all(b.path.name == "benchmarks.md" for b in benchmarks), [b.where for b in benchmarks]


def test_every_prelude_belongs_to_a_block() -> None:
    """A prelude whose block is gone (renamed, rewritten) is an error, not dead weight."""
    for key in [*PY_PRELUDE, *PY_EPILOGUE, *PY_SUBSTITUTE, *SHELL]:
        assert sum(key in b.text for b in RUN) == 1, f"{key!r} must name exactly one block"


@pytest.mark.slow  # one interpreter per benchmark, with the bench scripts' imports
@pytest.mark.parametrize(
    "block", [b for b in NOT_RUN if b.path.name == "benchmarks.md"], ids=lambda b: b.where
)
def test_benchmark_commands_name_real_scripts_and_options(block: Block) -> None:
    """A benchmark command that is not run still names a script and options its --help lists."""
    for line in block.text.splitlines():
        command = line.split("#", 1)[0].split()
        if len(command) < 2 or command[0] != ".venv/bin/python":
            continue
        assert (ROOT / command[1]).is_file(), f"{block.where}: {command[1]} does not exist"
        code, stdout, stderr = _help_of(command[1])
        assert code == 0, f"{block.where}: {command[1]} --help: {stderr[-2000:]}"
        for option in (word for word in command[2:] if word.startswith("--")):
            assert option in stdout, f"{block.where}: {command[1]} has no {option}"


@functools.cache
def _help_of(script: str) -> tuple[int, str, str]:
    """``script --help``: its exit code, stdout and stderr, asked once per script (the 44
    commands of docs/benchmarks.md name 14 scripts; each --help imports what its script
    measures, up to 1.5 s of CPU)."""
    shown = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env=clean_env(),
    )  # fmt: skip
    return shown.returncode, shown.stdout, shown.stderr


@pytest.mark.parametrize("block", [b for b in RUN if b.lang == "python"], ids=lambda b: b.where)
def test_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    """The Python block runs to exit 0 with only its user-owned names stubbed."""
    key = _config_for(block, PY_PRELUDE | PY_EPILOGUE)  # type: ignore[arg-type]
    text = block.text
    for old, new in PY_SUBSTITUTE.get(key or "", {}).items():
        assert old in text, f"{block.where}: the substitution {old!r} no longer matches"
        text = text.replace(old, new.format(port=free_port()))
    source = PY_PRELUDE.get(key or "", "") + text + PY_EPILOGUE.get(key or "", "")
    script = tmp_path / "block.py"
    script.write_text(source)
    ran = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=clean_env(), capture_output=True,
        text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 0, _failure(block, ran.returncode, ran.stdout + ran.stderr, source)


@pytest.mark.slow  # real processes: servers, workers, fresh venvs
@pytest.mark.parametrize("block", [b for b in RUN if b.lang == "sh"], ids=lambda b: b.where)
async def test_shell_block_runs_as_written(
    block: Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The shell block, pasted into bash in a fresh directory, ends with its documented code."""
    key = _config_for(block, SHELL)  # type: ignore[arg-type]
    shell = SHELL.get(key or "", Shell())
    cwd = request.getfixturevalue("checkout") if shell.checkout else tmp_path
    async with _server(shell.server, request) as values:
        values["port"] = str(free_port())
        text = block.text
        for old, new in shell.substitute.items():
            assert old in text, f"{block.where}: the substitution {old!r} no longer matches"
            text = text.replace(old, new.format(**values))
        prelude = shell.prelude.format(**values)
        serving = {p.format(**values): (r.format(**values), c) for p, (r, c) in shell.serve.items()}
        env = clean_env({name: value.format(**values) for name, value in shell.env.items()})
        await _run_block(block, shell, prelude, text, serving, cwd, env)


async def _run_block(
    block: Block,
    shell: Shell,
    prelude: str,
    text: str,
    serving: dict[str, tuple[str, int]],
    cwd: Path,
    env: dict[str, str],
) -> None:
    if prelude:
        ran = await run_bash(prelude, cwd, env)
        assert ran.code == 0, _failure(block, ran.code, ran.output, prelude, "its prelude")
    if not serving:
        ran = await run_bash(text, cwd, env)
        assert ran.code == shell.expect, _failure(block, ran.code, ran.output, text)
        return
    for line in _commands(text):  # a line that serves until Ctrl-C runs on its own
        serve = next((s for p, s in serving.items() if line.startswith(p.rstrip())), None)
        if serve is None:
            ran, expected = await run_bash(line, cwd, env), shell.expect
        else:
            ran, expected = await serve_then_interrupt(line, serve[0], cwd, env), serve[1]
        assert ran.code == expected, _failure(block, ran.code, ran.output, line)


def _commands(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.split("#", 1)[0].strip()]


class _server:
    """The test's own real server a block points at: ``{redis_url}``, ``{postgres_url}`` or
    ``{model_url}`` (an OpenAI-shaped loopback server answering every chat call)."""

    def __init__(self, kind: str | None, request: pytest.FixtureRequest) -> None:
        self.kind, self.request = kind, request
        self.model: SSEServer | None = None

    async def __aenter__(self) -> dict[str, str]:
        if self.kind == "redis":
            redis: RedisServer = self.request.getfixturevalue("redis_server")
            redis.flushall()
            return {"redis_url": redis.url}
        if self.kind == "postgres":
            pg: PostgresServer = self.request.getfixturevalue("pg_server")
            pg.terminate_backends()
            pg.reset_all()
            return {"postgres_url": pg.url}
        if self.kind == "model":
            answer = sse(*chat_chunks(["Long text, ", "summarised."], usage=(9, 3)))
            self.model = await SSEServer(responder=lambda request: answer).start()
            return {"model_url": self.model.base_url}
        return {}

    async def __aexit__(self, *exc: object) -> None:
        if self.model is not None:
            await self.model.aclose()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's tracked files (as they are in the working tree), as a fresh clone
    would have them; the install blocks share it (and the .venv the first one makes)."""
    return checkout_copy(tmp_path_factory.mktemp("clone"))


def _failure(block: Block, code: int, output: str, source: str, what: str = "the block") -> str:
    return (
        f"{block.where}: {what} exited {code}\n--- ran:\n{source}\n--- output (tail):\n"
        f"{output[-3000:]}"
    )


def test_a_broken_block_names_its_file_and_line() -> None:
    """The failure message of a block that cannot run starts with its file and line."""
    block = Block(ROOT / "README.md", 12, "sh", "false\n", None)
    assert _failure(block, 1, "", block.text).startswith("README.md:12: the block exited 1")
    assert re.search(
        r"^docs/\w+\.md:\d+$", next(b for b in BLOCKS if b.path.parent.name == "docs").where
    )
