"""Commands that look: ``status`` (``--watch``), ``ls``, ``result``, ``workers``.

Ages and durations are on the store's clock (a record's ``read_at``); a worker's last beat
is shown against this machine's clock.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
import orjson

from ai_lease.cli.context import Context
from ai_lease.cli.exits import EXIT_TIMED_OUT
from ai_lease.cli.look import Look, job_and_phi
from ai_lease.cli.output import (
    SINCE_FORMS,
    ago,
    end_with_corrupt,
    parse_since,
    print_result,
    to_json,
    warn_data_lost,
)
from ai_lease.cli.params import JOB_KEY
from ai_lease.cli.record_view import LS_HEADER, describe, job_json, ls_row
from ai_lease.errors import CorruptRecord, InputError, JobCancelled, JobFailed
from ai_lease.failure import FailureKind

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import JobState

EXIT_INTERRUPTED = 130
"""Ctrl-C during ``status --watch``: the shell's code for SIGINT, and no traceback."""
LS_MAX = 10_000
"""The most jobs ``ls`` reads (and its largest ``--limit``)."""


@click.command(short_help="Show job KEY's record and health (--watch: until it ends).")
@click.argument("key", type=JOB_KEY)
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@click.option("--watch", is_flag=True, help="Redraw until the job is DONE, FAILED or CANCELLED.")
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.1, 60),
    help="Seconds between looks with --watch (0.1 to 60).",
)
@click.pass_obj
def status(obj: Context, key: str, as_json: bool, watch: bool, interval: float) -> None:
    """Show job KEY: its record and the seed's four-state health
    (healthy / node lost / zombie / dead). With --watch, look again every --interval
    seconds until the job has ended: exit 0 DONE, 1 FAILED or CANCELLED, 3 FAILED by a
    timeout (Ctrl-C exits 130)."""
    if watch:
        from ai_lease.cli.watch import watch_job

        try:
            ended = watch_job(obj, key, interval=interval, as_json=as_json, describe=describe)
        except KeyboardInterrupt:
            sys.exit(EXIT_INTERRUPTED)
        _raise_unless_done(ended)
        return

    async def fetch(client: Client) -> Look:
        found = await job_and_phi(client, key)
        await warn_data_lost(client)
        return found

    job, phi, waiting = obj.run(fetch, create=False)
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    lease = obj.look
    if as_json:
        out = job_json(job, lease.renew_interval, phi, lease.phi_threshold, waiting=waiting)
        click.echo(to_json(out))
        return
    rows = describe(job, lease.renew_interval, phi, lease.phi_threshold, waiting=waiting)
    for label, value in rows:
        click.echo(f"{label:<11} {value}")


def _raise_unless_done(job: JobState) -> None:
    """A watched job that ended FAILED or CANCELLED ends the watch with its exit code (1,
    or 3 when a timeout failed it), as ``result`` and ``submit`` do."""
    from ai_lease.job import Status

    if job.status is Status.CANCELLED:
        raise JobCancelled(job.key, job.last_error)
    if job.status is Status.FAILED:
        raise JobFailed(job.key, job.last_error, job.ended_by)


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_since(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("ls")
@click.option(
    "--status",
    type=click.Choice(["PENDING", "RUNNING", "DONE", "FAILED", "CANCELLED"], case_sensitive=False),
    help="Only this status.",
)
@click.option(
    "--health",
    type=click.Choice(["healthy", "node lost", "zombie", "dead"]),
    help="Only RUNNING jobs in this health state.",
)
@click.option(
    "--kind",
    type=click.Choice([kind.value for kind in FailureKind]),
    help="Only FAILED jobs that failed this way (the record's failure kind).",
)
@click.option(
    "--since",
    metavar="AGE",
    callback=_since,
    help=f"Only jobs created within AGE: {SINCE_FORMS}.",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, LS_MAX),
    help=f"At most this many jobs (up to {LS_MAX:,}).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON lines (with health, result decoded)."
)
@click.pass_obj
def list_jobs(
    obj: Context,
    status: str | None,
    health: str | None,
    kind: str | None,
    since: float | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs (newest first): status, health, stage, age, duration, time since progress."""
    wanted = "RUNNING" if health else ("FAILED" if kind else (status.upper() if status else None))
    corrupt: list[CorruptRecord] = []
    # A filter applied here needs the whole (bounded) listing: the newest N may match none.
    reads = LS_MAX if (health or kind or since) else limit

    async def fetch(client: Client) -> tuple[list[JobState], int | None]:
        found = await client.list(status=wanted, limit=reads, on_corrupt=corrupt.append)
        if reads > limit or len(found) < limit:  # filtered here (counted below), or all
            return found, len(found)
        return found, await _held(client, wanted)

    jobs, held = obj.run(fetch, create=False)
    grace, threshold = obj.look.renew_interval, obj.look.phi_threshold
    if health:
        jobs = [j for j in jobs if (h := j.health(grace)) is not None and h.value == health]
    if kind:
        jobs = [j for j in jobs if j.failure_kind == kind]
    if since is not None:
        jobs = [j for j in jobs if j.read_at - j.created_at <= since]
    matched, jobs = len(jobs), jobs[:limit]
    if health or kind or since is not None:  # the filter ran here, over what was read
        held = matched if reads > matched else None
    if not as_json:
        click.echo(LS_HEADER)
    for job in jobs:
        if as_json:
            click.echo(orjson.dumps(job_json(job, grace, threshold=threshold)).decode())
        else:
            click.echo(ls_row(job, grace))
    for bad in corrupt:
        if as_json:
            click.echo(orjson.dumps({"key": bad.key, "corrupt": bad.detail}).decode())
        else:
            click.echo(f"{bad.key:<32} CORRUPT  {bad.detail}")
    _say_shown(len(jobs), held, limit)
    end_with_corrupt(corrupt, "marked CORRUPT")


async def _held(client: Client, status: str | None) -> int | None:
    """How many jobs of ``status`` (None: any) the store holds (None: it cannot count)."""
    from ai_lease.lease.base import JobListing

    if not client.serves(JobListing):
        return None
    counts = await client.counts()
    return counts.get(status, 0) if status else sum(counts.values())


def _say_shown(shown: int, held: int | None, limit: int) -> None:
    """On stderr (stdout stays rows): how many of how many, when ``ls`` shows fewer jobs
    than match."""
    if held is not None and held > shown:
        more = f"--limit N for more (up to {LS_MAX:,})"
        click.echo(f"ai-lease: {shown} of {held:,} jobs shown (newest first); {more}", err=True)
    elif held is None and shown >= limit:
        click.echo(f"ai-lease: the newest {shown} jobs shown; there may be more", err=True)


@click.command(short_help="Print the result of job KEY.")
@click.argument("key", type=JOB_KEY)
@click.pass_obj
def result(obj: Context, key: str) -> None:
    """Print the result of job KEY (exit 1 if it failed, 3 if it failed by a timeout or
    has not finished, 4 if its stored record is corrupt)."""
    from ai_lease.job import Status

    job = _get(obj, key)
    if job.status is Status.DONE:
        print_result(job)
    elif job.status is Status.CANCELLED:
        raise JobCancelled(key, job.last_error)
    elif job.status is Status.FAILED:
        raise JobFailed(key, job.last_error, job.ended_by)
    else:
        click.echo(f"ai-lease: job {key!r} is {job.status.value}, no result yet", err=True)
        sys.exit(EXIT_TIMED_OUT)


_WORKER_ROW = "{:<28} {:<16} {:>7} {:>8} {:>12} {:>12}"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_obj
def workers(obj: Context, as_json: bool) -> None:
    """List live workers: id, host, pid, jobs running of their concurrency, when each
    started and last reported, and the keys of the jobs each one runs. A worker reports
    its jobs at its beats: a job that has ended (or was handed back) since is left out,
    by its own record, read now."""
    from dataclasses import asdict

    from ai_lease.lease.queue import JobQueue
    from ai_lease.ui.listing import Workers, read_workers  # shared with the dashboard

    async def fetch(client: Client) -> Workers:
        if not client.serves(JobQueue):
            raise InputError(f"{obj.where} keeps no job queue")
        listing = await read_workers(client)
        await warn_data_lost(client)
        return listing

    listing = obj.run(fetch, create=False)
    found, corrupt, now = listing.found, listing.corrupt, listing.read_at
    if not found and not corrupt:
        click.echo(f"ai-lease: no live workers in {obj.where}", err=True)
    if not as_json:
        click.echo(_WORKER_ROW.format("WORKER", "HOST", "PID", "RUNNING", "STARTED", "LAST SEEN"))
    for info in found:
        if as_json:
            click.echo(orjson.dumps(asdict(info)).decode())
            continue
        click.echo(
            _WORKER_ROW.format(
                info.worker_id,
                info.host,
                info.pid,
                f"{info.running}/{info.concurrency}",
                ago(now - info.started_at),
                ago(now - info.last_seen),
            )
        )
        if info.jobs:
            click.echo(f"  running: {', '.join(info.jobs)}")
    for bad in corrupt:
        if as_json:
            click.echo(orjson.dumps({"worker_id": bad.key, "corrupt": bad.detail}).decode())
        else:
            click.echo(f"{bad.key:<28} CORRUPT  {bad.detail}")
    end_with_corrupt(corrupt, "marked CORRUPT")


def _get(obj: Context, key: str) -> JobState:
    job = obj.run(lambda client: client.status(key), create=False)
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    return job


COMMANDS = (status, list_jobs, result, workers)
