"""The ``ai-lease`` command line.

Exit codes: 0 done, 1 job failed, 2 bad input (config, job file, arguments),
3 timed out, 4 store unavailable or corrupt. Errors print one line; ``--debug`` shows
the traceback.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from .errors import AiLeaseError, InputError, JobFailed, StageTimeout, StoreError
from .job import JobState
from .lease import LeaseStore, mask_url, open_store
from .settings import Settings, load_settings

T = TypeVar("T")

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIMED_OUT, EXIT_STORE = 0, 1, 2, 3, 4


def _exit_code(exc: AiLeaseError) -> int:
    if isinstance(exc, InputError):
        return EXIT_BAD_INPUT
    if isinstance(exc, StageTimeout):
        return EXIT_TIMED_OUT
    if isinstance(exc, StoreError):
        return EXIT_STORE
    return EXIT_FAILED


class Context:
    """What every command shares: settings (loaded lazily, so --help never reads config)."""

    def __init__(self, config: Path | None, store_url: str | None, debug: bool) -> None:
        self.config_path, self.store_url, self.debug = config, store_url, debug
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            overrides: dict[str, Any] = {"store": {"url": self.store_url}} if self.store_url else {}
            self._settings = load_settings(self.config_path, **overrides)
        return self._settings

    def open_store(self) -> LeaseStore:
        store = self.settings.store
        return open_store(
            store.url,
            namespace=store.namespace,
            op_timeout=store.op_timeout,
            poll_interval=min(0.05, store.poll_interval),
        )

    def run(self, work: Callable[[LeaseStore], Awaitable[T]]) -> T:
        """Run ``work`` against the configured store, closing it afterwards."""

        async def main() -> T:
            store = self.open_store()
            try:
                return await work(store)
            finally:
                await store.aclose()

        return asyncio.run(main())


class _Group(click.Group):
    """Turns ai_lease errors into one clear line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AiLeaseError as exc:
            obj = ctx.obj
            if isinstance(obj, Context) and obj.debug:
                raise
            click.echo(f"ai-lease: error: {exc}", err=True)
            sys.exit(_exit_code(exc))


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
    help="Store URL: sqlite:///path.db (default), redis://host:6379/0, rediss://, unix://.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="ai_lease")
@click.pass_context
def main(ctx: click.Context, config: Path | None, store_url: str | None, debug: bool) -> None:
    """Run AI jobs under a progress-aware lease: a stuck owner can never hold a job hostage."""
    ctx.obj = Context(config, store_url, debug)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _describe(job: JobState, grace: float) -> list[tuple[str, str]]:
    def ago(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds:.1f}s ago"

    health = job.health(grace)
    rows = [
        ("status", job.status.value),
        ("health", health.value if health else "-"),
        ("owner", f"{job.owner_id or '-'} (token {job.token})"),
        ("stage", job.stage or "-"),
        ("progress", f"version {job.progress_version}, last {ago(job.since_progress)}"),
        ("heartbeat", ago(job.since_heartbeat)),
        ("lease", f"{job.lease_remaining:.1f}s left" if job.lease_live else "lapsed or none"),
        (
            "attempts",
            f"{job.attempts} (takeovers {job.takeovers}, missed renewals {job.missed_renewals})",
        ),
    ]
    if job.last_error:
        rows.append(("last error", job.last_error))
    if job.stall_snapshot:
        rows.append(("stuck at", job.stall_snapshot))
    return rows


@main.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@click.pass_obj
def status(obj: Context, key: str, as_json: bool) -> None:
    """Show job KEY: its record and the seed's four-state health
    (healthy / node lost / zombie / dead)."""
    job = obj.run(lambda store: store.get(key))
    if job is None:
        raise InputError(f"no job {key!r} in {mask_url(obj.settings.store.url)}")
    if as_json:
        click.echo(_json(job.to_dict()))
        return
    width = 11
    for label, value in _describe(job, obj.settings.lease.renew_interval):
        click.echo(f"{label:<{width}} {value}")
    if job.status.value == "FAILED":
        raise JobFailed(key, job.last_error)


@main.command("config")
@click.pass_obj
def show_config(obj: Context) -> None:
    """Print the effective settings (secrets masked) as JSON."""
    click.echo(obj.settings.model_dump_json(indent=2))
