"""``ai-lease worker``: run submitted jobs — discover them, compete for them, recover
abandoned ones — with metrics, JSON logs, a blocked-loop watchdog and a choice of event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import click

from ai_lease.cli.context import Context, build_client
from ai_lease.cli.worker_output import (
    log_job_event,
    log_worker_event,
    new_metrics,
    serving,
    watching,
)
from ai_lease.observe.loop_watchdog import DEFAULT_AFTER_S

if TYPE_CHECKING:
    from ai_lease.client import Client
    from ai_lease.lease.events import EventSink
    from ai_lease.observe.logs import JobLogger
    from ai_lease.observe.metrics import Metrics
    from ai_lease.providers import Provider

__all__ = ["COMMANDS", "worker"]


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
    from ai_lease.observe.logs import JobLogger, configure_logging

    settings = obj.settings
    shape = _NodeShape(
        concurrency,
        sweep_interval,
        grace,
        worker_id,
        isolation or settings.worker.isolation,  # a flag beats the settings
        settings.worker.terminate_grace if terminate_grace is None else terminate_grace,
    )
    metrics = new_metrics() if metrics_port is not None else None
    json_log = JobLogger(configure_logging(json=True), json=True) if log_json else None
    on_worker_event = json_log or log_worker_event

    async def work(client: Client) -> None:
        model_provider = obj.provider({"name": provider} if provider else {})
        node = _node(obj, client, model_provider, provider, shape, metrics, json_log)
        undo = node.install_signal_handlers()
        try:
            # served once Ctrl-C drains: a scraper (or a script) that sees the port answer
            # may stop the worker at once and get the drain, never a KeyboardInterrupt
            with (
                serving(metrics, metrics_port or 0, metrics_host),
                watching(metrics, client),
                _loop_watchdog(on_worker_event, blocked_loop_after),
            ):
                await node.run()
        finally:
            undo()
            await model_provider.aclose()

    obj.run(work, loop_factory)


class _Node(Protocol):
    """What the command does with its worker (a :class:`~ai_lease.Worker`)."""

    def install_signal_handlers(self) -> Callable[[], None]: ...

    async def run(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class _NodeShape:
    """The worker's own options, the flags over the settings."""

    concurrency: int
    sweep_interval: float
    grace: float
    worker_id: str | None
    isolation: str
    terminate_grace: float


def _node(
    obj: Context,
    client: Client,
    model_provider: Provider,
    provider: str | None,
    shape: _NodeShape,
    metrics: Metrics | None,
    json_log: JobLogger | None,
) -> _Node:
    """The Worker: its runner on ``model_provider`` (a job naming another provider runs on
    it, from these settings, or fails saying why); under process isolation each child
    builds its own provider, by name and options."""
    from ai_lease.cli.job_providers import SettingsProviders
    from ai_lease.cli.provider_options import provider_options
    from ai_lease.observe.logs import fan_out
    from ai_lease.run.isolation import ProviderFactory

    settings = obj.settings
    factory = None
    if shape.isolation == "process":
        name, options = provider_options(settings, {"name": provider} if provider else {})
        factory = ProviderFactory(name, **options)
    running = build_client(
        client,
        settings,
        obj.prompts(),
        provider=model_provider,
        on_event=fan_out(metrics, json_log or log_job_event),
        provider_resolver=SettingsProviders(settings, provider),
    )
    return running.worker(
        concurrency=shape.concurrency,
        sweep_interval=shape.sweep_interval,
        grace=shape.grace,
        worker_id=shape.worker_id,
        on_event=json_log or log_worker_event,
        isolation=shape.isolation,
        provider_factory=factory,
        terminate_grace=shape.terminate_grace,
    )


COMMANDS = (worker,)
