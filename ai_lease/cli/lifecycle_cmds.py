"""Commands that tidy jobs up: ``retry`` a failed or cancelled one, ``rm`` one, ``prune``
old ones. Each is one :class:`~ai_lease.client.Client` method, one atomic store operation."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

from ai_lease.cli.context import Context
from ai_lease.cli.params import JOB_KEY
from ai_lease.errors import InputError

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import JobState
    from ai_lease.lease.admin import Removal

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
TERMINAL = ("DONE", "FAILED", "CANCELLED")


def parse_duration(text: str) -> float:
    """Seconds in ``30s``, ``15m``, ``1h`` or ``7d`` (a number and one unit).

    >>> parse_duration("15m")
    900.0
    """
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: use a number and a unit, as in 30s, 15m, 1h or 7d"
        )
    return float(match[1]) * _UNITS[match[2]]


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def admin(client: Client, where: str) -> Client:
    """``client``, if its store can retry, remove and prune, else bad input saying not."""
    from ai_lease.lease.admin import JobAdmin

    if not client.serves(JobAdmin):
        raise InputError(f"{where} cannot retry, remove or prune jobs")
    return client


async def reopen(obj: Context, client: Client, key: str, *, force: bool) -> None:
    """A CANCELLED key runs again only with --force (a FAILED one too): it goes back to
    PENDING with a fresh attempt budget first, so the run is a new one under a higher token.
    Without --force a CANCELLED key is bad input (exit 2), never a silent no-op."""
    from ai_lease.job import Status
    from ai_lease.lease.rules import RETRYABLE

    record = await client.status(key)
    if record is None or record.status not in RETRYABLE:
        return
    if force:
        await admin(client, obj.where).retry(key)
    elif record.status is Status.CANCELLED:
        raise InputError(
            f"job {key!r} was cancelled: pass --force to run it again (a new run under a "
            "higher token), or submit it under a new key"
        )


@click.command(short_help="Run a FAILED or CANCELLED job again (workers take it).")
@click.argument("key", type=JOB_KEY)
@click.pass_obj
def retry(obj: Context, key: str) -> None:
    """Send job KEY, FAILED or CANCELLED, back to PENDING with a fresh attempt budget: due for
    workers at once. Exit 0 done, 2 for an unknown key or a job that is RUNNING, PENDING or
    DONE (nothing changed)."""
    from ai_lease.job import Status
    from ai_lease.lease.rules import RETRYABLE

    async def work(client: Client) -> tuple[JobState | None, JobState | None]:
        jobs = admin(client, obj.where)
        before = await client.status(key)
        if before is None or before.status not in RETRYABLE:
            return before, None
        return before, await jobs.retry(key)  # atomic: a job changed meanwhile is kept

    before, job = obj.run(work, create=False)
    if before is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if job is None or job.status is not Status.PENDING:
        now = (job or before).status.value
        raise InputError(
            f"job {key!r} is {now}: only a FAILED or CANCELLED job can be retried (nothing changed)"
        )
    click.echo(f"retried {key}: PENDING, due for workers")
    if job.spec is None:
        click.echo(
            f"ai-lease: note: job {key!r} has no stored spec (it ran in the foreground): "
            "workers cannot run it; `ai-lease submit JOB_FILE` runs it here",
            err=True,
        )


@click.command("rm", short_help="Remove job KEY's record (--force: even a running one).")
@click.argument("key", type=JOB_KEY)
@click.option("--force", is_flag=True, help="Remove a RUNNING job too: cancel it first.")
@click.pass_obj
def remove(obj: Context, key: str, force: bool) -> None:
    """Remove job KEY: its record, queue entry and lease. A RUNNING job under a live lease is
    kept unless --force, which cancels it first (its owner stops, its followers get an
    error) and then removes it. Exit 0 removed, 2 for an unknown key or a live job."""

    async def work(client: Client) -> Removal:
        # a store that cannot remove is bad input, said first
        reason = "removed with ai-lease rm --force"
        return await admin(client, obj.where).remove(key, force=force, reason=reason)

    removal = obj.run(work, create=False)
    if removal.job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if not removal.removed:
        job = removal.job
        raise InputError(
            f"job {key!r} is RUNNING under a live lease (owner {job.owner_id}, "
            f"{job.lease_remaining:.1f}s left): pass --force to cancel and remove it"
        )
    click.echo(f"removed {key}")


@click.command(short_help="Remove terminal jobs older than a duration.")
@click.option(
    "--older-than",
    required=True,
    callback=_duration,
    metavar="DURATION",
    help="Last written longer ago than this: 30s, 15m, 1h, 7d.",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(TERMINAL, case_sensitive=False),
    help="Only jobs of this status (repeatable; default all three terminal ones).",
)
@click.pass_obj
def prune(obj: Context, older_than: float, statuses: tuple[str, ...]) -> None:
    """Remove the DONE, FAILED and CANCELLED jobs (or those of --status) last written more
    than --older-than ago; print how many. RUNNING and PENDING jobs are never removed."""
    wanted = frozenset(s.upper() for s in statuses) or frozenset(TERMINAL)
    count = obj.run(lambda client: admin(client, obj.where).prune(older_than, wanted), create=False)
    click.echo(f"pruned {count} job{'' if count == 1 else 's'}")


COMMANDS = (retry, remove, prune)
