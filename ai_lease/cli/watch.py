"""``ai-lease status KEY --watch``: look at one job every few seconds until it has ended.

On a terminal the rows are redrawn in place (rich); otherwise the rows are printed again
each time the job moves (status, stage, owner, progress, health), so a log shows each step
once. With ``--json`` each move is one JSON line.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Any, Protocol

import click
import orjson

from ai_lease.cli.look import job_and_phi
from ai_lease.errors import InputError

if TYPE_CHECKING:
    from ai_lease.cli.context import Context
    from ai_lease.client import Client
    from ai_lease.job import JobState
    from ai_lease.observe.phi import OwnerPhi


class Describe(Protocol):
    """The rows shown for one look (:func:`ai_lease.cli.record_view.describe`)."""

    def __call__(
        self,
        job: JobState,
        grace: float,
        phi: OwnerPhi | None,
        threshold: float,
        *,
        waiting: str | None = None,
    ) -> list[tuple[str, str]]: ...


def watch_job(
    obj: Context, key: str, *, interval: float, as_json: bool, describe: Describe
) -> JobState:
    """Show job ``key`` every ``interval`` seconds until it is terminal; its last record."""
    grace = obj.look.renew_interval
    live = not as_json and sys.stdout.isatty()
    show = _Shown(describe, grace, as_json=as_json, live=live)
    show.threshold = obj.look.phi_threshold

    async def watch(client: Client) -> JobState:
        while True:
            job, phi, waiting = await job_and_phi(client, key)
            if job is None:
                raise InputError(f"no job {key!r} in {obj.where}")
            show.update(job, phi, waiting)
            if job.status.terminal:
                return job
            await asyncio.sleep(interval)

    with show:
        return obj.run(watch, create=False)


class _Shown:
    """What the watch has shown, and how it shows the next look."""

    def __init__(self, describe: Describe, grace: float, *, as_json: bool, live: bool) -> None:
        self.describe, self.grace, self.as_json = describe, grace, as_json
        self._last: tuple[Any, ...] | None = None
        self.threshold = 8.0  # φ at which the owner reads as suspect
        self._live: Any = None
        if live:
            from rich.console import Console
            from rich.live import Live

            from ai_lease.cli.terminal import raw

            console = Console(file=raw(sys.stdout))  # its own escapes; the texts made inert
            self._live = Live(console=console, auto_refresh=False, transient=False)

    def __enter__(self) -> _Shown:
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(
        self, job: JobState, phi: OwnerPhi | None = None, waiting: str | None = None
    ) -> None:
        described = self.describe(job, self.grace, phi, self.threshold, waiting=waiting)
        rows = "\n".join(f"{label:<11} {value}" for label, value in described)
        if self._live is not None:
            from rich.text import Text

            from ai_lease.text_safety import inert

            self._live.update(Text(inert(rows)), refresh=True)
            return
        moved = _moves(job, self.grace)
        if moved == self._last:
            return
        if self._last is not None and not self.as_json:
            click.echo("")
        self._last = moved
        if self.as_json:
            from ai_lease.cli.record_view import job_json

            out = job_json(job, self.grace, phi, self.threshold, waiting=waiting)
            click.echo(orjson.dumps(out).decode())
        else:
            click.echo(rows)


def _moves(job: JobState, grace: float) -> tuple[Any, ...]:
    """What must change for a plain watch to print the job again."""
    health = job.health(grace)
    return (job.status, job.stage, job.owner_id, job.token, job.progress_version, health)
