"""Commands that manage: ``cancel``, ``providers``, ``config``, ``tune``."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from ai_lease.cli.context import Context
from ai_lease.cli.output import end_with_corrupt, to_json
from ai_lease.cli.params import JOB_KEY
from ai_lease.errors import CorruptRecord, InputError
from ai_lease.redaction import MASK, redact

if TYPE_CHECKING:
    from ai_lease.client import Client

# Shipped inside the package (ai_lease/data/), beside the default prompts.
DEFAULT_CONFIG_TEXT = Path(__file__).resolve().parents[1] / "data" / "ai-lease.toml"


@click.command(short_help="Cancel job KEY: it never runs (again), its owner stops.")
@click.argument("key", type=JOB_KEY)
@click.option("--reason", default="cancelled with ai-lease cancel", help="Stored as its error.")
@click.pass_obj
def cancel(obj: Context, key: str, reason: str) -> None:
    """Cancel job KEY. A PENDING job never runs; a RUNNING one's owner stops within one
    renew interval (its renewal is refused, its commit rejected); followers get an error.
    Exit 0 cancelled (also if it already was), 2 if there is no job KEY or it had already
    ended DONE or FAILED (nothing changed). `ai-lease submit --force` runs it again."""
    from ai_lease.job import Status

    job = obj.run(lambda client: client.cancel(key, reason), create=False)
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if job.status is not Status.CANCELLED:
        raise InputError(
            f"job {key!r} already ended {job.status.value}: not cancelled (nothing changed)"
        )
    click.echo(f"cancelled {key}")


@click.command(short_help="Install the PostgreSQL store's schema (tables and functions).")
@click.pass_obj
def migrate(obj: Context) -> None:
    """Install or upgrade the PostgreSQL store's schema: its tables, its fencing-token
    sequence and its lease functions, in the PostgreSQL schema named after store.namespace,
    in one transaction (all of it or, on any error, nothing). The store does this by itself
    on first use when its user may create the schema; run `ai-lease migrate` once as a user
    who may (CREATE on the database) when the workers' user may not. Running it again is
    safe: it says the schema is up to date. SQLite and Redis need no migration.

    Exit 0 applied or up to date, 2 refused (no right to create the schema, a table of
    ours that ai_lease did not make, a bad URL or credentials), 4 store unreachable."""
    url = obj.settings.store.url
    if not url.startswith(("postgresql://", "postgres://")):
        click.echo(f"{obj.where}: this store needs no migration (only PostgreSQL does)")
        return
    namespace = obj.settings.store.namespace
    applied, version = obj.run(lambda client: client.migrate())
    if applied:
        click.echo(f"applied migration {version} to schema {namespace!r} in {obj.where}")
    else:
        click.echo(f"schema {namespace!r} in {obj.where} is up to date (migration {version})")


@click.command(short_help="List the provider names and the wire format each speaks.")
def providers() -> None:
    """List the providers that can be named (built-in and installed plug-ins), each with
    the wire format it speaks."""
    from ai_lease.providers import available_providers, wire_format

    names = available_providers()
    width = max(map(len, names))
    for name in names:
        click.echo(f"{name:<{width}}  {wire_format(name)}")


@click.command("config")
@click.option(
    "--defaults",
    is_flag=True,
    help="Print the annotated default settings file instead (a start for your own).",
)
@click.pass_obj
def show_config(obj: Context, defaults: bool) -> None:
    """Print the effective settings (secrets masked) as JSON: it parses, and every value
    in it (the store URL included) is one the settings accept back."""
    if defaults:
        click.echo(DEFAULT_CONFIG_TEXT.read_text(encoding="utf-8"), nl=False)
        return
    click.echo(to_json(_masked(obj.settings.model_dump(mode="json"))))


_SECRET_PARAM = re.compile(
    r"(?i)([?&](?:password|pass|api_key|apikey|key|token|access_token|secret)=)[^&#]*"
)


_SECRET_NAME = re.compile(r"(?i)api_?key|password|secret|token")  # a SecretStr field, whole


def _masked(value: Any) -> Any:
    """A settings dump with every secret masked value by value, before it becomes JSON (a
    mask applied to the JSON text broke it: ``"api_key": ***``). A URL keeps its form, its
    password (user info or a secret-named query parameter) shown as ``***``."""
    if isinstance(value, dict):
        return {
            name: MASK if _SECRET_NAME.fullmatch(name) and isinstance(item, str) else _masked(item)
            for name, item in value.items()
        }
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, str):
        return redact(_masked_url(value) if "://" in value else value)
    return value


def _masked_url(url: str) -> str:
    """``url`` with its password masked, as written otherwise (``sqlite:///rel.db`` stays
    that: urlunsplit made it ``sqlite:/rel.db``); an unparseable one shows only its scheme."""
    from ai_lease.redaction import mask_url

    try:
        urlsplit(url).password  # noqa: B018 -- raises ValueError for an unparseable netloc
    except ValueError:
        return url.partition("://")[0] + "://***"
    return _SECRET_PARAM.sub(r"\1***", mask_url(url))


def _in_range(low: float, high: float) -> Callable[[click.Context, click.Parameter, float], float]:
    """An option callback: a finite number in (low, high], else a usage error (exit 2)
    naming the option and the range (click's FloatRange lets nan through)."""

    def check(ctx: click.Context, param: click.Parameter, value: float) -> float:
        if not (math.isfinite(value) and low < value <= high):
            raise click.BadParameter(f"{value:g} is not in the range {low:g} < x <= {high:g}")
        return value

    return check


@click.command(short_help="Suggest budgets from recorded stage durations.")
@click.option(
    "--factor",
    default=1.5,
    show_default=True,
    type=float,
    callback=_in_range(0, 100),
    help="Safety factor over the P99.",
)
@click.option(
    "--floor",
    default=1.0,
    show_default=True,
    type=float,
    callback=_in_range(0, 86_400),
    help="Never suggest less (seconds).",
)
@click.option(
    "--min-samples",
    default=20,
    show_default=True,
    type=click.IntRange(1, 1_000_000_000),
    help="Suggest nothing for stages with fewer recorded durations.",
)
@click.option(
    "--write",
    "write_to",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the suggestions as a TOML settings file (use with --config).",
)
@click.option("--force", is_flag=True, help="Overwrite the --write file if it exists.")
@click.pass_obj
def tune(
    obj: Context, factor: float, floor: float, min_samples: int, write_to: Path | None, force: bool
) -> None:
    """Suggest budgets from recorded stage durations: max_no_progress = max(floor, P99 x
    factor) per stage, first_token and idle from the streams' own histograms."""
    from ai_lease.lease.histogram import DurationHistory
    from ai_lease.observe.history import suggest
    from ai_lease.observe.tuning import render_table, render_toml

    corrupt: list[CorruptRecord] = []

    async def fetch(client: Client) -> Any:
        if not client.serves(DurationHistory):
            raise InputError(f"{obj.where} keeps no duration history")
        return await client.durations(on_corrupt=corrupt.append)

    suggestions = suggest(
        obj.run(fetch, create=False), factor=factor, floor=floor, min_samples=min_samples
    )
    click.echo(render_table(suggestions, obj.settings))  # the budgets in force now
    if write_to is not None:
        if write_to.exists() and not force:
            raise InputError(f"{str(write_to)!r} exists: pass --force to overwrite it")
        try:
            write_to.write_text(render_toml(suggestions), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {str(write_to)!r}: {exc.strerror}") from None
        click.echo(f"wrote {write_to} (use it with --config, or copy its tables)", err=True)
    for bad in corrupt:
        click.echo(f"ai-lease: skipped: {bad}", err=True)
    end_with_corrupt(corrupt, "skipped, named above")


COMMANDS = (cancel, migrate, providers, show_config, tune)
