"""Commands that run jobs: ``submit`` (here, or recorded for workers) and ``demo``; the
``worker`` command is :mod:`~ai_lease.cli.worker_cmd`. Every
running :class:`~ai_lease.client.Client` the CLI uses comes from
:func:`~ai_lease.cli.context.build_client`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ai_lease.cli.context import Context, build_client
from ai_lease.cli.output import print_result, to_json

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.job import Job, JobState
    from ai_lease.lease.events import Event
    from ai_lease.prompts import PromptLibrary


@click.command(short_help="Run a job file here (or --detach it for workers).")
@click.argument("job_file", type=click.Path(path_type=Path))
@click.option("--key", help="Override the job's key.")
@click.option("--input", "input_text", metavar="TEXT", help="Override the job's input text.")
@click.option(
    "--input-file",
    type=click.Path(path_type=Path),
    help="Read the input from this file (read here, stored with the job).",
)
@click.option(
    "--prompts",
    "prompts_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Look for prompt templates here first (then in prompts/ beside the job file).",
)
@click.option("--provider", help="Override the provider (see `ai-lease providers`).")
@click.option("--model", help="Override the model.")
@click.option(
    "--priority",
    type=click.IntRange(-100, 100),
    help="Its turn for a provider slot under [limits]: higher first (default 0).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the final record as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the result.")
@click.option(
    "--detach",
    is_flag=True,
    help="Only record the job for workers (`ai-lease worker`) and print its key.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Run a CANCELLED or FAILED key again: a new run under a higher token.",
)
@click.option(
    "--cancel-on-interrupt",
    is_flag=True,
    help="On SIGINT/SIGTERM cancel the job (default: leave it to workers).",
)
@click.pass_obj
def submit(
    obj: Context,
    job_file: Path,
    key: str | None,
    input_text: str | None,
    input_file: Path | None,
    prompts_dir: Path | None,
    provider: str | None,
    model: str | None,
    priority: int | None,
    as_json: bool,
    quiet: bool,
    detach: bool,
    force: bool,
    cancel_on_interrupt: bool,
) -> None:
    """Run JOB_FILE (TOML or JSON) here under the lease.

    If another node already runs the same key, follow it and print its result; if the key
    already has a result, print it at once. With --detach, only record it for workers.
    A CANCELLED key runs again only with --force. On SIGINT/SIGTERM the lease is released
    and the job left to workers (or cancelled, with --cancel-on-interrupt): exit 130.
    Exit 0 done, 1 failed, 2 bad input, 3 timed out (any timeout: stream first-token,
    idle or total; stage or job deadline), 4 store unavailable or corrupt.
    """
    from ai_lease.cli.job_providers import choice_overrides
    from ai_lease.cli.jobfile import load_job_file

    spec = load_job_file(  # the flags join the job's [provider] choice, stored with it
        job_file,
        {
            "key": key,
            "input": input_text,
            "input_file": str(input_file) if input_file else None,
            "model": model,
            "provider": provider,
            "provider_model": model,
            "priority": priority,
        },
    )
    overrides = choice_overrides(obj.settings, spec.job.provider)
    prompts = obj.prompts([*([prompts_dir] if prompts_dir else []), job_file.parent / "prompts"])
    how = _HowToRun(force=force, cancel_on_interrupt=cancel_on_interrupt)
    if detach:
        record = obj.run(lambda client: _record_for_workers(obj, client, spec.job, prompts, how))
        click.echo(to_json(record.to_dict()) if as_json else record.key)
        return
    chatty = not (quiet or as_json)
    _run_here(obj, spec.job, overrides, prompts, how, chatty=chatty, as_json=as_json)


@dataclasses.dataclass(frozen=True)
class _HowToRun:
    force: bool = False  # run a CANCELLED or FAILED key again
    cancel_on_interrupt: bool = False  # on SIGINT/SIGTERM cancel the job, not hand it over


async def _record_for_workers(
    obj: Context, client: Client, job: Job, prompts: PromptLibrary, how: _HowToRun
) -> JobState:
    """``submit --detach``: the job recorded for workers (a CANCELLED key only with --force)."""
    from ai_lease.cli.lifecycle_cmds import reopen

    await reopen(obj, client, job.key, force=how.force)
    limit = obj.settings.job.max_input_bytes
    return await build_client(client, obj.settings, prompts, max_input_bytes=limit).submit(job)


async def _run_interruptibly(obj: Context, client: Client, job: Job, how: _HowToRun) -> JobState:
    """``client.run(job)``; the first SIGINT/SIGTERM unwinds it (its lease released), hands
    the job back (to workers, or cancelled) and raises :class:`Interrupted`."""
    from ai_lease.cli.interrupt import Interrupted, cancelled_by_signals, hand_back
    from ai_lease.cli.lifecycle_cmds import reopen

    async with cancelled_by_signals() as caught:
        try:
            await reopen(obj, client, job.key, force=how.force)
            return await client.run(job)
        except asyncio.CancelledError:
            name = caught.check()  # re-raised unless a signal did it
            done = await hand_back(client, job, cancel=how.cancel_on_interrupt)
            raise Interrupted(name, done) from None


def _run_here(
    obj: Context,
    job: Job,
    overrides: dict[str, Any],
    prompts: PromptLibrary,
    how: _HowToRun,
    *,
    chatty: bool,
    as_json: bool,
) -> None:
    """Run ``job`` on this node (or follow the node that runs it) and print how it ended.
    SIGINT/SIGTERM: the lease is released, the job handed back, one line, exit 130."""
    from ai_lease.cli.console import JobView, TeeProvider
    from ai_lease.cli.exits import EXIT_INTERRUPTED
    from ai_lease.cli.interrupt import Interrupted

    settings = obj.settings
    run_config = settings.run_config()
    view = JobView(
        job.key,
        live=chatty and sys.stderr.isatty(),
        timings=run_config.timings,
        stream=run_config.stream_timeouts,
        attempts=run_config.retry.attempts,
    )
    capped: list[Event] = []

    def on_event(event: Event) -> None:
        if event.kind == "answer_capped":
            capped.append(event)
        if chatty:
            view.on_event(event)

    async def work(client: Client) -> JobState:
        model_provider = obj.provider(overrides)
        tee = TeeProvider(model_provider, view)
        running = build_client(  # the provider was built for this job's own choice
            client,
            settings,
            prompts,
            provider=tee,
            on_event=on_event,
            max_input_bytes=settings.job.max_input_bytes,
            provider_serves=job.provider,
        )
        try:
            return await _run_interruptibly(obj, running, job, how)
        finally:
            await running.aclose()  # saves the durations; the store and provider stay open
            await model_provider.aclose()

    try:
        with view if chatty else contextlib.nullcontext():
            record = obj.run(work)
            if chatty:
                view.finish(record)  # the summary line; the answer is printed once, below
    except Interrupted as stop:
        click.echo(f"ai-lease: {stop}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    _print_end(record, as_json, capped)


def _print_end(record: JobState, as_json: bool, capped: list[Event]) -> None:
    """The record as JSON, or the answer (and a note when it stopped at max_tokens)."""
    if as_json:
        click.echo(to_json(record.to_dict()))
        return
    print_result(record)
    if capped:
        click.echo(f"ai-lease: note: {capped[-1].detail}", err=True)


@click.command(short_help="Watch a zombie owner lose its job (about 16 s).")
@click.option("--json", "as_json", is_flag=True, help="Emit every node's events as JSON lines.")
@click.option(
    "--ui",
    is_flag=True,
    help="Show the job in the web dashboard (needs the ui extra) and keep it up afterwards.",
)
@click.option("--no-open", is_flag=True, help="With --ui: print the address, open no browser.")
@click.option(
    "--linger",
    type=click.FloatRange(0, 86_400),
    default=None,
    help="With --ui: seconds the dashboard stays up after the demo (default: until Ctrl-C).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65_535),
    default=None,
    help="With --ui: the dashboard's port on 127.0.0.1 (default: a free one).",
)
@click.pass_obj
def demo(
    obj: Context, as_json: bool, ui: bool, no_open: bool, linger: float | None, port: int | None
) -> None:
    """Watch a zombie owner lose its job: three nodes race for one job, the owner's model
    call hangs while its heartbeat lives, a follower takes over with a higher token, and the
    old owner's late write is rejected. About 16 seconds, on a throw-away SQLite store
    (or the --store given). With --ui, the dashboard draws the job's timeline as it happens:
    one lane per node, the lapse, the takeover with its new token, the rejected write."""
    from ai_lease.cli.demo import run

    if ui:
        from ai_lease.cli.demo_ui import ui_available
        from ai_lease.cli.ui_cmd import MISSING_EXTRA

        if not ui_available():
            click.echo(f"ai-lease: error: {MISSING_EXTRA}", err=True)
            sys.exit(2)
    code = run(
        obj.store_url, as_json=as_json, ui=ui, open_browser=not no_open, linger=linger, port=port
    )
    sys.exit(code)


COMMANDS = (submit, demo)
