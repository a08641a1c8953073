"""How commands print: JSON, a job's result, the store's warnings, corrupt entries skipped."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any

import click
import orjson

from ai_lease.cli.exits import EXIT_STORE
from ai_lease.errors import CorruptRecord, StoreError

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import JobState


def to_json(value: Any) -> str:
    """``value`` as indented JSON."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def print_result(record: JobState) -> None:
    """A DONE job's result: its text as is, anything else as JSON."""
    try:
        value = record.output
    except orjson.JSONDecodeError:
        raise CorruptRecord(record.key, "its stored result is not JSON") from None
    # color=True: click would strip ANSI sequences from a pipe; the answer goes out as it is
    # (on a terminal the guard writes them as visible escapes: ai_lease.cli.terminal)
    click.echo(value if isinstance(value, str) else to_json(value), color=True)


def end_with_corrupt(found: list[CorruptRecord], marked: str) -> None:
    """After a listing that skipped corrupt entries: one line saying so, exit 4."""
    if found:
        many = f"{len(found)} stored entries are" if len(found) > 1 else "1 stored entry is"
        click.echo(f"ai-lease: error: {many} corrupt ({marked}); the rest is shown", err=True)
        sys.exit(EXIT_STORE)


async def warn_data_lost(client: Client) -> None:
    """Print the store's data-loss report (a Redis restart without persistence), if any."""
    try:
        loss = await client.data_lost()
    except StoreError:
        return
    if loss is not None:
        click.echo(f"ai-lease: warning: {loss}", err=True)


def span(seconds: float | None) -> str:
    """A span for people: ``0.04 s``, ``2.5 s``, ``12 s``, ``4 min``, ``3 h``, ``2 d``
    ("-" if unknown)."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def ago(seconds: float | None) -> str:
    """``3 s ago`` ("-" if unknown)."""
    return "-" if seconds is None else f"{span(seconds)} ago"


_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}
SINCE_FORMS = "30s, 15m, 1h or 7d"


def parse_since(text: str) -> float:
    """``30s`` / ``15m`` / ``1h`` / ``7d`` as seconds; ValueError naming the forms otherwise."""
    found = re.fullmatch(r"([0-9]{1,9})([smhd])", text.strip().lower())
    if found is None or int(found.group(1)) == 0:
        raise ValueError(
            f"expected a positive whole number and a unit: {SINCE_FORMS} (got {text!r})"
        )
    return int(found.group(1)) * _UNITS[found.group(2)]
