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

import importlib
import sys
from pathlib import Path
from typing import Any

import click

# `ai-lease --help` must stay quick: the settings (pydantic-settings), the prompts (Jinja2),
# the runner, the providers (httpx, openai) and the console (rich) are imported by the
# commands that use them, and each command's module when that command is asked for
# (tests/test_import_discipline.py holds the line).
from ai_lease.cli.context import Context
from ai_lease.cli.exits import exit_code
from ai_lease.cli.terminal import guard_terminal
from ai_lease.errors import AiLeaseError
from ai_lease.redaction import redact

__all__ = ["main"]


COMMAND_MODULES = {
    **dict.fromkeys(("submit", "demo"), "run_cmds"),
    "worker": "worker_cmd",
    **dict.fromkeys(("status", "ls", "result", "workers"), "inspect_cmds"),
    **dict.fromkeys(("cancel", "migrate", "providers", "config", "tune"), "admin_cmds"),
    **dict.fromkeys(("retry", "rm", "prune"), "lifecycle_cmds"),
    "events": "timeline_cmds",
    "ui": "ui_cmd",
}
"""Each command's module under ``ai_lease.cli`` (its ``COMMANDS``), by command name."""


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
        names = {*super().list_commands(ctx), *COMMAND_MODULES}
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else 99, n))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, its module imported on first use: ``ai-lease ls``
        loads neither the worker's nor the dashboard's nor submit's module."""
        module = COMMAND_MODULES.get(cmd_name)
        if cmd_name not in self.commands and module is not None:
            for command in importlib.import_module(f"ai_lease.cli.{module}").COMMANDS:
                self.add_command(command)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as exc:  # suggest from every command, loaded or not
            names = self.list_commands(ctx)
            raise click.exceptions.NoSuchCommand(exc.command_name, None, names, ctx) from None

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
