"""``ai-lease events KEY``: what happened to one job, from its timeline in the store.

Each entry was written by the operation that caused it (acquired, renewed, renew refused,
stalled, released, taken over, fenced write rejected, committed, failed, cancelled; and
a process-isolated job's termination ladder, noted by its worker: terminated, reaped): one
line each, or one JSON object per line with ``--json``. ``--follow`` polls for new entries
until the job has ended; Ctrl-C exits 130 quietly.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click
import orjson

from ai_lease.cli.context import Context
from ai_lease.cli.params import JOB_KEY
from ai_lease.errors import InputError

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.lease.timeline import TimelineEntry

EXIT_INTERRUPTED = 130
FOLLOW_INTERVAL = 0.5
"""Seconds between looks with ``--follow``."""


def timeline_of(client: Client, where: str) -> Client:
    """``client``, if its store keeps timelines, else bad input saying it keeps none."""
    from ai_lease.lease.timeline import JobTimeline

    if not client.serves(JobTimeline):
        raise InputError(f"{where} keeps no job timelines")
    return client


def line(entry: TimelineEntry) -> str:
    """One entry for people: time (UTC), kind, owner, token, stage, detail."""
    at = datetime.fromtimestamp(entry.at, UTC).isoformat(timespec="milliseconds")
    kind = entry.kind.replace("_", " ")
    owner, stage = entry.owner_id or "-", entry.stage or "-"
    text = f"{at[:-6]}Z  {kind:<21}  {owner}  token {entry.token}  stage {stage}"
    return f"{text}  {entry.detail}" if entry.detail else text


class _Printer:
    """Prints the entries not yet printed, and remembers the last one's seq."""

    def __init__(self, key: str, *, as_json: bool) -> None:
        self.key, self.as_json, self.after, self._told = key, as_json, 0, False

    async def more(self, client: Client) -> None:
        entries, dropped = await client.events(self.key, after_seq=self.after)
        if dropped and not self._told:
            click.echo(f"ai-lease: note: {dropped} earlier entries were dropped (cap)", err=True)
            self._told = True
        for entry in entries:
            data = {"key": self.key, **entry.to_dict()}
            text = orjson.dumps(data).decode() if self.as_json else line(entry)
            click.echo(text)
            self.after = entry.seq


@click.command(short_help="Show job KEY's timeline: what happened to it, in order.")
@click.argument("key", type=JOB_KEY)
@click.option("--follow", is_flag=True, help="Print new entries as they come, until it ends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry, per line.")
@click.pass_obj
def events(obj: Context, key: str, follow: bool, as_json: bool) -> None:
    """Show job KEY's timeline: one line per entry (time, kind, owner, token, stage,
    detail), oldest first; the store keeps the last 200. With --follow, poll for new ones
    every 0.5 s until the job is DONE, FAILED or CANCELLED (Ctrl-C exits 130). Exit 2 for
    an unknown key."""
    printer = _Printer(key, as_json=as_json)

    async def show(client: Client) -> None:
        lines = timeline_of(client, obj.where)
        job = await client.status(key)
        if job is None:
            raise InputError(f"no job {key!r} in {obj.where}")
        await printer.more(lines)
        while follow and job is not None and not job.status.terminal:
            await asyncio.sleep(FOLLOW_INTERVAL)
            job = await client.status(key)  # read before the entries: the last one is printed
            await printer.more(lines)

    try:
        obj.run(show, create=False)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


COMMANDS = (events,)
