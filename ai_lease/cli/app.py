"""The ``ai-lease`` command line: the click group, its global options, its error handling.

Exit codes: 0 done, 1 job failed, 2 bad input (config, job file, arguments, a key reused
with another payload), 3 timed out (any timeout: a stream's first-token, idle or total
budget, a stage's hard deadline, the job's deadline — also when the job ended FAILED for
it), 4 store unavailable, missing (a command that only looks never creates one) or
corrupt. Errors print one line; ``--debug`` shows the traceback. A cancelled job is a
failed one (1).

The commands live by what they do: :mod:`~ai_lease.cli.run_cmds` (submit, demo),
:mod:`~ai_lease.cli.worker_cmd` (worker),
:mod:`~ai_lease.cli.inspect_cmds` (status, ls, result, workers) and
:mod:`~ai_lease.cli.admin_cmds` (cancel, providers, config, tune),
:mod:`~ai_lease.cli.lifecycle_cmds` (retry, rm, prune); what they share is in
:mod:`~ai_lease.cli.context`, :mod:`~ai_lease.cli.output` and :mod:`~ai_lease.cli.exits`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

# `ai-lease --help` must stay quick: the settings (pydantic-settings), the prompts (Jinja2),
# the runner, the providers (httpx, openai) and the console (rich) are imported by the
# commands that use them (tests/test_import_discipline.py holds the line).
from ai_lease.cli import (
    admin_cmds,
    inspect_cmds,
    lifecycle_cmds,
    run_cmds,
    timeline_cmds,
    ui_cmd,
    worker_cmd,
)
from ai_lease.cli.context import Context
from ai_lease.cli.exits import exit_code
from ai_lease.cli.terminal import guard_terminal
from ai_lease.errors import AiLeaseError
from ai_lease.redaction import redact

__all__ = ["main"]


class _Group(click.Group):
    """Turns ai_lease errors into one clear line and an exit code; lists commands in the
    order people need them."""

    ORDER = (
        "submit",
        "status",
        "result",
        "ls",
        "worker",
        "workers",
        "tune",
        "ui",
        "demo",
        "providers",
        "config",
    )

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else 99, n))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AiLeaseError as exc:
            obj = ctx.obj
            if isinstance(obj, Context) and obj.debug:
                raise
            click.echo(f"ai-lease: error: {redact(str(exc))}", err=True)
            sys.exit(exit_code(exc))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    envvar="AI_LEASE_CONFIG",
    help="TOML settings file (default: config/ai-lease.toml if present).",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Store URL: sqlite:///path.db (default), redis://host:6379/0, rediss://, unix://, "
    "redis+cluster://, postgresql://user@host:5432/db.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="ai_lease")
@click.pass_context
def main(ctx: click.Context, config: Path | None, store_url: str | None, debug: bool) -> None:
    """Run AI jobs under a progress-aware lease: a stuck owner can never hold a job hostage.

    Start with `ai-lease submit JOB_FILE`; see `ai-lease demo` for a zombie owner being
    taken over.

    Exit codes: 0 done, 1 failed, 2 bad input, 3 timed out (any timeout: stream
    first-token, idle or total; stage or job deadline), 4 store unavailable, missing
    (status, ls and the other looks never create one: `submit` does) or corrupt.
    """
    ctx.obj = Context(config, store_url, debug)
    ctx.call_on_close(guard_terminal())  # what reaches a terminal is shown, never obeyed


_ALL = (
    *run_cmds.COMMANDS,
    *worker_cmd.COMMANDS,
    *inspect_cmds.COMMANDS,
    *admin_cmds.COMMANDS,
    *lifecycle_cmds.COMMANDS,
)
for _command in (*_ALL, *timeline_cmds.COMMANDS, *ui_cmd.COMMANDS):
    main.add_command(_command)
