"""Commands that run jobs: ``submit`` (here, or recorded for workers), ``worker``, ``demo``.

:func:`_runner` builds every :class:`~ai_lease.run.runner.Runner` the CLI uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ai_lease.cli.context import Context
from ai_lease.cli.output import print_result, to_json
from ai_lease.cli.worker_output import (
    log_job_event,
    log_worker_event,
    new_metrics,
    serving,
    watching,
)
from ai_lease.observe.loop_watchdog import DEFAULT_AFTER_S

if TYPE_CHECKING:
    from ai_lease.job import Job, JobState
    from ai_lease.job_provider import ProviderChoice
    from ai_lease.lease import LeaseStore
    from ai_lease.observe.events import Event, EventSink
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers import Provider
    from ai_lease.run.provider_pick import ProviderResolver
    from ai_lease.run.runner import Runner
    from ai_lease.settings import Settings


def _runner(
    store: LeaseStore,
    settings: Settings,
    prompts: PromptLibrary,
    *,
    provider: Provider | None = None,
    on_event: EventSink | None = None,
    max_input_bytes: int | None = None,
    provider_resolver: ProviderResolver | None = None,
    provider_serves: ProviderChoice | None = None,
) -> Runner:
    """Every Runner the CLI builds. Without a provider it only records jobs for workers
    (``submit --detach``); with one it runs them under the settings' budgets."""
    import dataclasses

    from ai_lease.inputs import DEFAULT_MAX_INPUT_BYTES
    from ai_lease.run.config import RunHooks
    from ai_lease.run.runner import Runner

    limit = DEFAULT_MAX_INPUT_BYTES if max_input_bytes is None else max_input_bytes
    config = dataclasses.replace(settings.run_config(), max_input_bytes=limit)
    if provider is None:
        return Runner(store, prompts=prompts, config=config)
    hooks = RunHooks(on_event=on_event)
    return Runner(
        store,
        provider=provider,
        prompts=prompts,
        config=config,
        hooks=hooks,
        provider_resolver=provider_resolver,
        provider_serves=provider_serves,
    )


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
        },
    )
    overrides = choice_overrides(obj.settings, spec.job.provider)
    prompts = obj.prompts([*([prompts_dir] if prompts_dir else []), job_file.parent / "prompts"])
    how = _HowToRun(force=force, cancel_on_interrupt=cancel_on_interrupt)
    if detach:
        record = obj.run(lambda store: _record_for_workers(obj, store, spec.job, prompts, how))
        click.echo(to_json(record.to_dict()) if as_json else record.key)
        return
    chatty = not (quiet or as_json)
    _run_here(obj, spec.job, overrides, prompts, how, chatty=chatty, as_json=as_json)


@dataclasses.dataclass(frozen=True)
class _HowToRun:
    force: bool = False  # run a CANCELLED or FAILED key again
    cancel_on_interrupt: bool = False  # on SIGINT/SIGTERM cancel the job, not hand it over


async def _record_for_workers(
    obj: Context, store: LeaseStore, job: Job, prompts: PromptLibrary, how: _HowToRun
) -> JobState:
    """``submit --detach``: the job recorded for workers (a CANCELLED key only with --force)."""
    from ai_lease.cli.lifecycle_cmds import reopen

    await reopen(obj, store, job.key, force=how.force)
    limit = obj.settings.job.max_input_bytes
    return await _runner(store, obj.settings, prompts, max_input_bytes=limit).submit(job)


async def _run_interruptibly(obj: Context, runner: Runner, job: Job, how: _HowToRun) -> JobState:
    """``runner.run(job)``; the first SIGINT/SIGTERM unwinds it (its lease released), hands
    the job back (to workers, or cancelled) and raises :class:`Interrupted`."""
    from ai_lease.cli.interrupt import Interrupted, cancelled_by_signals, hand_back
    from ai_lease.cli.lifecycle_cmds import reopen

    async with cancelled_by_signals() as caught:
        try:
            await reopen(obj, runner.store, job.key, force=how.force)
            return await runner.run(job)
        except asyncio.CancelledError:
            name = caught.check()  # re-raised unless a signal did it
            done = await hand_back(runner, job, cancel=how.cancel_on_interrupt)
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
    live = chatty and sys.stderr.isatty()
    view = JobView(
        job.key,
        live=live,
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

    async def work(store: LeaseStore) -> JobState:
        model_provider = obj.provider(overrides)
        tee = TeeProvider(model_provider, view)
        limit = settings.job.max_input_bytes
        runner = _runner(  # the provider was built for this job's own choice
            store,
            settings,
            prompts,
            provider=tee,
            on_event=on_event,
            max_input_bytes=limit,
            provider_serves=job.provider,
        )
        try:
            return await _run_interruptibly(obj, runner, job, how)
        finally:
            await runner.flush_history()
            await model_provider.aclose()

    try:
        with view if chatty else contextlib.nullcontext():
            record = obj.run(work)
            if chatty:
                view.finish(record)  # the summary line; the answer is printed once, below
    except Interrupted as stop:
        click.echo(f"ai-lease: {stop}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if as_json:
        click.echo(to_json(record.to_dict()))
        return
    print_result(record)
    if capped:
        click.echo(f"ai-lease: note: {capped[-1].detail}", err=True)


def _event_loop(
    ctx: click.Context, param: click.Parameter, value: str
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``--loop``: asyncio's loop (None), or uvloop's; ``auto`` takes uvloop when installed.
    Asking for uvloop without it installed is a usage error (exit 2) saying how to get it."""
    if value == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if value == "auto":
            return None
        raise click.BadParameter(
            "uvloop is not installed: pip install 'ai_lease[uvloop]' (or use --loop asyncio)"
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """Refuse nan and inf, which FloatRange lets through (None: not given)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number of seconds (got {value!r})")
    return value


@contextlib.contextmanager
def _loop_watchdog(on_event: EventSink, after_s: float) -> Iterator[None]:
    """``--blocked-loop-after``: the loop watched while the worker runs (0: not)."""
    if after_s <= 0:
        yield
        return
    from ai_lease.observe.loop_watchdog import watch_loop

    with watch_loop(on_event, after_s=after_s):
        yield


@click.command()
@click.option(
    "--concurrency",
    "-c",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Jobs run at once.",
)
@click.option(
    "--sweep-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.01),
    callback=_finite,
    help="Seconds between looks at the queue for due jobs (at least 0.01).",
)
@click.option(
    "--grace",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    callback=_finite,
    help="On SIGTERM/SIGINT, seconds running jobs get to finish before stepping down.",
)
@click.option("--provider", help="Provider for jobs (default: the settings').")
@click.option("--worker-id", help="Name shown by `ai-lease workers` (default host:pid).")
@click.option(
    "--isolation",
    type=click.Choice(["task", "process"]),
    default=None,
    help="Run each job as a task here, or its stages up to parse in a warm child process "
    "(stopped by SIGTERM, then SIGKILL, when it stalls or is cancelled). Under task, a "
    "blocking call in an async provider or stage (time.sleep, sync I/O) freezes the whole "
    "worker, renewals and SIGTERM included (--blocked-loop-after reports it); process "
    "stops it. Default: [worker] isolation (task).",
)
@click.option(
    "--terminate-grace",
    default=None,
    type=click.FloatRange(0, 300),
    callback=_finite,
    help="With --isolation process: seconds a child gets after SIGTERM before SIGKILL. "
    "Default: [worker] terminate_grace (10).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (see docs/observability.md).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics server binds (0.0.0.0: every interface).",
)
@click.option("--log-json", is_flag=True, help="Log every event as one JSON line on stderr.")
@click.option(
    "--blocked-loop-after",
    default=DEFAULT_AFTER_S,
    show_default=True,
    type=click.FloatRange(min=0),
    callback=_finite,
    metavar="SECONDS",
    help="Warn (loop_blocked, with the stack of the blocking call) when the event loop runs "
    "nothing for this long: a blocking call under --isolation task freezes every job. "
    "0: off.",
)
@click.option(
    "--loop",
    "loop_factory",
    type=click.Choice(["asyncio", "uvloop", "auto"]),
    default="asyncio",
    show_default=True,
    callback=_event_loop,
    help="Event loop: uvloop needs the 'uvloop' extra; auto takes it when installed.",
)
@click.pass_obj
def worker(
    obj: Context,
    concurrency: int,
    sweep_interval: float,
    grace: float,
    provider: str | None,
    worker_id: str | None,
    isolation: str | None,
    terminate_grace: float | None,
    metrics_port: int | None,
    metrics_host: str,
    log_json: bool,
    blocked_loop_after: float,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> None:
    """Run submitted jobs: discover them, compete for them, recover abandoned ones.

    Start any number of workers on any number of machines against the same store. The
    first SIGTERM/SIGINT drains (running jobs get --grace seconds, then hand over); a
    second stops at once. Jobs submitted with `ai-lease submit --detach` are picked up.
    A job whose file named a provider ([provider] name, model, base_url, headers) runs on
    it, with this worker's key for it; one it cannot run (unknown provider, no key, a host
    its key may not go to) ends FAILED at once with the reason (`ai-lease status KEY`).
    """
    from ai_lease.cli.job_providers import SettingsProviders
    from ai_lease.cli.provider_options import provider_options
    from ai_lease.observe.logs import JobLogger, configure_logging, fan_out
    from ai_lease.run.isolation import ProviderFactory
    from ai_lease.run.worker import Worker

    settings = obj.settings
    isolation = isolation or settings.worker.isolation  # a flag beats the settings
    if terminate_grace is None:
        terminate_grace = settings.worker.terminate_grace
    metrics = new_metrics() if metrics_port is not None else None
    json_log = JobLogger(configure_logging(json=True), json=True) if log_json else None

    async def work(store: LeaseStore) -> None:
        overrides = {"name": provider} if provider else {}
        model_provider = obj.provider(overrides)
        factory = None
        if isolation == "process":  # each child builds its own, by name and options
            name, options = provider_options(settings, overrides)
            factory = ProviderFactory(name, **options)
        on_event = fan_out(metrics, json_log or log_job_event)
        runner = _runner(
            store,
            settings,
            obj.prompts(),
            provider=model_provider,
            on_event=on_event,
            # a job naming a provider runs on it, from these settings, or fails saying why
            provider_resolver=SettingsProviders(settings, provider),
        )
        node = Worker(
            store,
            runner,
            concurrency=concurrency,
            sweep_interval=sweep_interval,
            grace=grace,
            worker_id=worker_id,
            on_event=json_log or log_worker_event,
            isolation=isolation,
            provider_factory=factory,
            terminate_grace=terminate_grace,
        )
        undo = node.install_signal_handlers()
        try:
            # served once Ctrl-C drains: a scraper (or a script) that sees the port answer
            # may stop the worker at once and get the drain, never a KeyboardInterrupt
            with (
                serving(metrics, metrics_port or 0, metrics_host),
                watching(metrics, store),
                _loop_watchdog(json_log or log_worker_event, blocked_loop_after),
            ):
                await node.run()
        finally:
            undo()
            await model_provider.aclose()

    obj.run(work, loop_factory)


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


COMMANDS = (submit, worker, demo)
