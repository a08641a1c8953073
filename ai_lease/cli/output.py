"""How commands print: JSON, a job's result, the store's warnings, corrupt entries skipped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
import orjson

from ai_lease.cli.exits import EXIT_STORE
from ai_lease.errors import CorruptRecord, StoreError

if TYPE_CHECKING:
    from ai_lease.job import JobState
    from ai_lease.lease import LeaseStore


def to_json(value: Any) -> str:
    """``value`` as indented JSON."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def print_result(record: JobState) -> None:
    """A DONE job's result: its text as is, anything else as JSON."""
    try:
        value = record.output
    except orjson.JSONDecodeError:
        raise CorruptRecord(record.key, "its stored result is not JSON") from None
    click.echo(value if isinstance(value, str) else to_json(value))


def end_with_corrupt(found: list[CorruptRecord], marked: str) -> None:
    """After a listing that skipped corrupt entries: one line saying so, exit 4."""
    if found:
        many = f"{len(found)} stored entries are" if len(found) > 1 else "1 stored entry is"
        click.echo(f"ai-lease: error: {many} corrupt ({marked}); the rest is shown", err=True)
        sys.exit(EXIT_STORE)


async def warn_data_lost(store: LeaseStore) -> None:
    """Print the store's data-loss report (a Redis restart without persistence), if any."""
    check = getattr(store, "data_lost", None)
    if check is None:
        return
    try:
        loss = await check()
    except StoreError:
        return
    if loss is not None:
        click.echo(f"ai-lease: warning: {loss}", err=True)
