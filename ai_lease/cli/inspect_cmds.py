"""Commands that look: ``status``, ``ls``, ``result``, ``workers``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import orjson

from ai_lease.cli.context import Context
from ai_lease.cli.exits import EXIT_TIMED_OUT
from ai_lease.cli.output import end_with_corrupt, print_result, to_json, warn_data_lost
from ai_lease.errors import CorruptRecord, InputError, JobCancelled, JobFailed
from ai_lease.redaction import redact

if TYPE_CHECKING:
    from ai_lease.job import JobState
    from ai_lease.lease import LeaseStore


@click.command(short_help="Show job KEY's record and health.")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@click.pass_obj
def status(obj: Context, key: str, as_json: bool) -> None:
    """Show job KEY: its record and the seed's four-state health
    (healthy / node lost / zombie / dead)."""

    async def fetch(store: LeaseStore) -> JobState | None:
        job = await store.get(key)
        await warn_data_lost(store)
        return job

    job = obj.run(fetch)
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if as_json:
        click.echo(to_json(job.to_dict()))
        return
    for label, value in _describe(job, obj.settings.lease.renew_interval):
        click.echo(f"{label:<11} {value}")


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
    "--limit",
    default=50,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="At most this many jobs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON lines.")
@click.pass_obj
def list_jobs(
    obj: Context, status: str | None, health: str | None, limit: int, as_json: bool
) -> None:
    """List jobs (newest first) with their status and health."""
    wanted = "RUNNING" if health else (status.upper() if status else None)
    corrupt: list[CorruptRecord] = []
    jobs = obj.run(
        lambda store: store.list_jobs(status=wanted, limit=limit, on_corrupt=corrupt.append)
    )
    grace = obj.settings.lease.renew_interval
    if health:
        jobs = [j for j in jobs if (h := j.health(grace)) is not None and h.value == health]
    for job in jobs:
        if as_json:
            click.echo(orjson.dumps(job.to_dict()).decode())
            continue
        state = job.health(grace)
        idle = job.since_progress
        click.echo(
            f"{job.key:<32} {job.status.value:<8} {state.value if state else '-':<10} "
            f"{job.stage or '-':<13} {'' if idle is None else f'idle {idle:.1f}s'}"
        )
    for bad in corrupt:
        if as_json:
            click.echo(orjson.dumps({"key": bad.key, "corrupt": bad.detail}).decode())
        else:
            click.echo(f"{bad.key:<32} CORRUPT  {bad.detail}")
    end_with_corrupt(corrupt, "marked CORRUPT")


@click.command(short_help="Print the result of job KEY.")
@click.argument("key")
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
        raise JobFailed(key, job.last_error)
    else:
        click.echo(f"ai-lease: job {key!r} is {job.status.value}, no result yet", err=True)
        sys.exit(EXIT_TIMED_OUT)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_obj
def workers(obj: Context, as_json: bool) -> None:
    """List live workers: id, host, pid, jobs running, last seen."""
    from dataclasses import asdict

    from ai_lease.lease.base import JobQueue

    corrupt: list[CorruptRecord] = []

    async def fetch(store: LeaseStore) -> list[Any]:
        if not isinstance(store, JobQueue):
            raise InputError(f"{obj.where} keeps no job queue")
        found = await store.list_workers(on_corrupt=corrupt.append)
        await warn_data_lost(store)
        return found

    for info in obj.run(fetch):
        if as_json:
            click.echo(orjson.dumps(asdict(info)).decode())
        else:
            click.echo(
                f"{info.worker_id:<28} host {info.host:<16} pid {info.pid:<7} "
                f"running {info.running}/{info.concurrency}  "
                f"last seen {info.last_seen:.0f} (store clock)"
            )
    for bad in corrupt:
        if as_json:
            click.echo(orjson.dumps({"worker_id": bad.key, "corrupt": bad.detail}).decode())
        else:
            click.echo(f"{bad.key:<28} CORRUPT  {bad.detail}")
    end_with_corrupt(corrupt, "marked CORRUPT")


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
    if job.finish_reason == "length":
        rows.append(("answer", "capped at max_tokens (finish_reason length)"))
    if job.last_error:
        rows.append(("last error", redact(job.last_error)))
    if job.stall_snapshot:
        rows.append(("stuck at", redact(job.stall_snapshot)))
    return rows


def _get(obj: Context, key: str) -> JobState:
    job = obj.run(lambda store: store.get(key))
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    return job


COMMANDS = (status, list_jobs, result, workers)
