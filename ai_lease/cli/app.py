"""The ``ai-lease`` command line.

Exit codes: 0 done, 1 job failed, 2 bad input (config, job file, arguments, a key reused
with another payload), 3 timed out (any timeout: a stream's first-token, idle or total
budget, a stage's hard deadline, the job's deadline — also when the job ended FAILED for
it), 4 store unavailable or corrupt. Errors print one line; ``--debug`` shows the traceback.
A cancelled job is a failed one (1).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import click
import orjson

from ai_lease.errors import (
    AiLeaseError,
    ConfigError,
    CorruptRecord,
    InputError,
    JobCancelled,
    JobConflict,
    JobFailed,
    StageTimeout,
    StoreError,
)
from ai_lease.redaction import redact

# `ai-lease --help` must stay quick: the settings (pydantic-settings), the prompts (Jinja2),
# the runner, the providers (httpx, openai) and the console (rich) are imported by the
# commands that use them (tests/test_import_discipline.py holds the line).
if TYPE_CHECKING:
    import asyncio

    from pydantic import SecretStr

    from ai_lease.job import JobState
    from ai_lease.lease import LeaseStore
    from ai_lease.observe.events import Event
    from ai_lease.prompts import PromptLibrary
    from ai_lease.providers import Provider
    from ai_lease.settings import Settings

T = TypeVar("T")

DEFAULT_CONFIG_TEXT = Path(__file__).resolve().parent / "data" / "ai-lease.toml"  # shipped

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIMED_OUT, EXIT_STORE = 0, 1, 2, 3, 4


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    direct: type
    for direct in cls.__subclasses__():
        found += [direct, *_subclasses(direct)]
    return found


@cache
def _timed_out() -> re.Pattern[str]:
    """A FAILED job's reason starts with the error that ended its last attempt, by class name."""
    names = "|".join(sorted(c.__name__ for c in _subclasses(StageTimeout)))
    return re.compile(r"(?:gave up after \d+ attempts: )?(?:" + names + "): ")


def _exit_code(exc: AiLeaseError) -> int:
    if isinstance(exc, InputError | JobConflict):
        return EXIT_BAD_INPUT
    if isinstance(exc, StageTimeout):
        return EXIT_TIMED_OUT
    if isinstance(exc, JobFailed) and _timed_out().match(exc.reason or ""):
        return EXIT_TIMED_OUT
    if isinstance(exc, StoreError):
        return EXIT_STORE
    return EXIT_FAILED


def _in_range(low: float, high: float) -> Callable[[click.Context, click.Parameter, float], float]:
    """An option callback: a finite number in (low, high], else a usage error (exit 2)
    naming the option and the range (click's FloatRange lets nan through)."""

    def check(ctx: click.Context, param: click.Parameter, value: float) -> float:
        if not (math.isfinite(value) and low < value <= high):
            raise click.BadParameter(f"{value:g} is not in the range {low:g} < x <= {high:g}")
        return value

    return check


class Context:
    """What every command shares: settings (loaded lazily, so --help never reads config)."""

    def __init__(self, config: Path | None, store_url: str | None, debug: bool) -> None:
        self.config_path, self.store_url, self.debug = config, store_url, debug
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            from ai_lease.settings import load_settings

            overrides: dict[str, Any] = {"store": {"url": self.store_url}} if self.store_url else {}
            self._settings = load_settings(self.config_path, **overrides)
            _register_secrets(self._settings)
        return self._settings

    @property
    def where(self) -> str:
        from ai_lease.lease import mask_url

        return mask_url(self.settings.store.url)

    def open_store(self) -> LeaseStore:
        from ai_lease.lease import open_store

        store = self.settings.store
        return open_store(
            store.url,
            namespace=store.namespace,
            op_timeout=store.op_timeout,
            poll_interval=min(0.05, store.poll_interval),
        )

    def run(
        self,
        work: Callable[[LeaseStore], Awaitable[T]],
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ) -> T:
        """Run ``work`` against the configured store (on a loop from ``loop_factory``, default
        asyncio's), closing it afterwards."""
        import asyncio

        async def main() -> T:
            store = self.open_store()
            try:
                return await work(store)
            finally:
                await store.aclose()

        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())

    def prompts(self, folders: list[Path] | None = None) -> PromptLibrary:
        """The prompt library, bounded by the settings' ``[job]`` limits."""
        from ai_lease.prompts import PromptLibrary

        job = self.settings.job
        return PromptLibrary(
            folders or [], render_timeout=job.render_timeout, max_output_chars=job.max_prompt_chars
        )

    def provider(self, overrides: dict[str, Any]) -> Provider:
        """The provider the settings name, with a job file's or the flags' overrides. The
        key goes only to the base URL it was configured for (or an allowed host)."""
        from ai_lease.providers import create_provider
        from ai_lease.providers.keys import check_key_destination

        cfg = self.settings.provider
        name = overrides.get("name", cfg.name)
        key = None if name == "local-extractive" else cfg.api_key or _ambient_key()
        base_url = overrides.get("base_url", cfg.base_url)
        if key is not None and base_url is not None and base_url != cfg.base_url:
            check_key_destination(base_url, cfg.base_url, cfg.allowed_hosts)
        options = {"model": overrides.get("model", cfg.model), "base_url": base_url, "api_key": key}
        if name in ("openai", "openai-compatible"):
            # The settings' sampling values are the provider's defaults: a job's own win.
            options["temperature"] = cfg.temperature
            options["max_tokens"] = cfg.max_tokens
            options["max_event_bytes"] = self.settings.stream.max_event_bytes
        if name == "openai-compatible":
            options["http"] = cfg.http
        return create_provider(name, **options)


def _ambient_key() -> SecretStr | None:
    """``OPENAI_API_KEY``, checked like a configured key (and masked from then on)."""
    from pydantic import SecretStr

    from ai_lease.providers.keys import check_api_key
    from ai_lease.redaction import register_secret

    key = os.environ.get("OPENAI_API_KEY") or None
    if key is None:
        return None
    try:
        check_api_key(key)
    except ValueError as exc:
        raise ConfigError(f"environment OPENAI_API_KEY: {exc}") from None
    register_secret(key)
    return SecretStr(key)


def _register_secrets(settings: Settings) -> None:
    """Every secret the settings hold, masked from every text that leaves the process."""
    from ai_lease.redaction import register_secret, register_url_secrets

    key = settings.provider.api_key
    register_secret(key.get_secret_value() if key is not None else None)
    register_url_secrets(settings.store.url)
    register_url_secrets(settings.provider.base_url)


class _Group(click.Group):
    """Turns ai_lease errors into one clear line and an exit code; lists commands in the
    order people need them."""

    ORDER = (
        "submit",
        "status",
        "result",
        "ls",
        "worker",
        "workers",
        "tune",
        "demo",
        "providers",
        "config",
    )

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: (self.ORDER.index(n) if n in self.ORDER else 99, n))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AiLeaseError as exc:
            obj = ctx.obj
            if isinstance(obj, Context) and obj.debug:
                raise
            click.echo(f"ai-lease: error: {redact(str(exc))}", err=True)
            sys.exit(_exit_code(exc))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    type=click.Path(path_type=Path),
    envvar="AI_LEASE_CONFIG",
    help="TOML settings file (default: config/ai-lease.toml if present).",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Store URL: sqlite:///path.db (default), redis://host:6379/0, rediss://, unix://, "
    "redis+cluster://.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="ai_lease")
@click.pass_context
def main(ctx: click.Context, config: Path | None, store_url: str | None, debug: bool) -> None:
    """Run AI jobs under a progress-aware lease: a stuck owner can never hold a job hostage.

    Start with `ai-lease submit JOB_FILE`; see `ai-lease demo` for a zombie owner being
    taken over.

    Exit codes: 0 done, 1 failed, 2 bad input, 3 timed out (any timeout: stream
    first-token, idle or total; stage or job deadline), 4 store unavailable or corrupt.
    """
    ctx.obj = Context(config, store_url, debug)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def _print_result(record: JobState) -> None:
    try:
        value = record.output
    except orjson.JSONDecodeError:
        raise CorruptRecord(record.key, "its stored result is not JSON") from None
    click.echo(value if isinstance(value, str) else _json(value))


def _end_with_corrupt(found: list[CorruptRecord], marked: str) -> None:
    """After a listing that skipped corrupt entries: one line saying so, exit 4."""
    if found:
        many = f"{len(found)} stored entries are" if len(found) > 1 else "1 stored entry is"
        click.echo(f"ai-lease: error: {many} corrupt ({marked}); the rest is shown", err=True)
        sys.exit(EXIT_STORE)


@main.command(short_help="Run a job file here (or --detach it for workers).")
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
) -> None:
    """Run JOB_FILE (TOML or JSON) here under the lease.

    If another node already runs the same key, follow it and print its result; if the key
    already has a result, print it at once. With --detach, only record it for workers.
    Exit 0 done, 1 failed, 2 bad input, 3 timed out (any timeout: stream first-token,
    idle or total; stage or job deadline), 4 store unavailable or corrupt.
    """
    from ai_lease.cli.console import JobView, TeeProvider
    from ai_lease.cli.jobfile import load_job_file
    from ai_lease.run.config import RunHooks
    from ai_lease.run.runner import Runner

    spec = load_job_file(
        job_file,
        {
            "key": key,
            "input": input_text,
            "input_file": str(input_file) if input_file else None,
            "model": model,
        },
    )
    overrides = {
        **spec.provider,
        **({"name": provider} if provider else {}),
        **({"model": model} if model else {}),
    }
    settings = obj.settings
    prompts = obj.prompts([*([prompts_dir] if prompts_dir else []), job_file.parent / "prompts"])
    run_config = settings.run_config()
    if detach:
        record = obj.run(
            lambda store: Runner(store, prompts=prompts, config=run_config).submit(spec.job)
        )
        click.echo(_json(record.to_dict()) if as_json else record.key)
        return
    view = JobView(spec.job.key, live=not (quiet or as_json) and sys.stderr.isatty())
    chatty = not (quiet or as_json)
    capped: list[Event] = []

    def on_event(event: Event) -> None:
        if event.kind == "answer_capped":
            capped.append(event)
        if chatty:
            view.on_event(event)

    async def work(store: LeaseStore) -> JobState:
        model_provider = obj.provider(overrides)
        runner = Runner(
            store,
            provider=TeeProvider(model_provider, view),
            prompts=prompts,
            config=run_config,
            hooks=RunHooks(on_event=on_event),
        )
        try:
            return await runner.run(spec.job)
        finally:
            await runner.flush_history()
            await model_provider.aclose()

    with view if chatty else _nothing():
        record = obj.run(work)
    if as_json:
        click.echo(_json(record.to_dict()))
    else:
        _print_result(record)
        if capped:
            click.echo(f"ai-lease: note: {capped[-1].detail}", err=True)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


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


async def _warn_data_lost(store: LeaseStore) -> None:
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


def _get(obj: Context, key: str) -> JobState:
    job = obj.run(lambda store: store.get(key))
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    return job


@main.command(short_help="Show job KEY's record and health.")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the record as JSON.")
@click.pass_obj
def status(obj: Context, key: str, as_json: bool) -> None:
    """Show job KEY: its record and the seed's four-state health
    (healthy / node lost / zombie / dead)."""

    async def fetch(store: LeaseStore) -> JobState | None:
        job = await store.get(key)
        await _warn_data_lost(store)
        return job

    job = obj.run(fetch)
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if as_json:
        click.echo(_json(job.to_dict()))
        return
    for label, value in _describe(job, obj.settings.lease.renew_interval):
        click.echo(f"{label:<11} {value}")


@main.command("ls")
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
    _end_with_corrupt(corrupt, "marked CORRUPT")


@main.command(short_help="Print the result of job KEY.")
@click.argument("key")
@click.pass_obj
def result(obj: Context, key: str) -> None:
    """Print the result of job KEY (exit 1 if it failed, 3 if it failed by a timeout or
    has not finished, 4 if its stored record is corrupt)."""
    from ai_lease.job import Status

    job = _get(obj, key)
    if job.status is Status.DONE:
        _print_result(job)
    elif job.status is Status.CANCELLED:
        raise JobCancelled(key, job.last_error)
    elif job.status is Status.FAILED:
        raise JobFailed(key, job.last_error)
    else:
        click.echo(f"ai-lease: job {key!r} is {job.status.value}, no result yet", err=True)
        sys.exit(EXIT_TIMED_OUT)


@main.command(short_help="Cancel job KEY: it never runs (again), its owner stops.")
@click.argument("key")
@click.option("--reason", default="cancelled with ai-lease cancel", help="Stored as its error.")
@click.pass_obj
def cancel(obj: Context, key: str, reason: str) -> None:
    """Cancel job KEY. A PENDING job never runs; a RUNNING one's owner stops within one
    renew interval (its renewal is refused, its commit rejected); followers get an error.
    Exit 0 cancelled (also if it already was), 1 if it had already ended DONE or FAILED
    (nothing changed), 2 if there is no job KEY."""
    from ai_lease.job import Status

    job = obj.run(lambda store: store.cancel(key, reason))
    if job is None:
        raise InputError(f"no job {key!r} in {obj.where}")
    if job.status is not Status.CANCELLED:
        ended = job.status.value
        click.echo(f"ai-lease: job {key!r} already ended {ended}: not cancelled", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(f"cancelled {key}")


@main.command(short_help="List the provider names (built-in and plug-ins).")
def providers() -> None:
    """List the providers that can be named (built-in and installed plug-ins)."""
    from ai_lease.providers import available_providers

    for name in available_providers():
        click.echo(name)


@main.command("config")
@click.option(
    "--defaults",
    is_flag=True,
    help="Print the annotated default settings file instead (a start for your own).",
)
@click.pass_obj
def show_config(obj: Context, defaults: bool) -> None:
    """Print the effective settings (secrets masked) as JSON."""
    if defaults:
        click.echo(DEFAULT_CONFIG_TEXT.read_text(encoding="utf-8"), nl=False)
        return
    click.echo(redact(_json(_masked_urls(obj.settings.model_dump(mode="json")))))


_SECRET_PARAMS = {"password", "pass", "api_key", "apikey", "key", "token", "access_token", "secret"}


def _masked_urls(value: Any) -> Any:
    """Every URL in a settings dump with its password (user info or a secret-named query
    parameter) shown as ``***``: ``provider.base_url`` may carry ``user:password@``."""
    if isinstance(value, dict):
        return {name: _masked_urls(item) for name, item in value.items()}
    if isinstance(value, str) and "://" in value:
        return _masked_url(value)
    return value


def _masked_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not parseable as a URL: show nothing after the scheme
        return url.partition("://")[0] + "://***"
    netloc = parts.netloc
    if password is not None:
        netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
    query = [
        (name, "***" if name.lower() in _SECRET_PARAMS else item)
        for name, item in parse_qsl(parts.query, keep_blank_values=True)
    ]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe="*")))


@main.command(short_help="Watch a zombie owner lose its job (about 15 s).")
@click.option("--json", "as_json", is_flag=True, help="Emit every node's events as JSON lines.")
@click.pass_obj
def demo(obj: Context, as_json: bool) -> None:
    """Watch a zombie owner lose its job: three nodes race for one job, the owner's model
    call hangs while its heartbeat lives, a follower takes over with a higher token, and the
    old owner's late write is rejected. About 30 seconds, on a throw-away SQLite store
    (or the --store given)."""
    import asyncio

    from ai_lease.cli.demo import run_demo

    sys.exit(asyncio.run(run_demo(obj.store_url, as_json=as_json)))


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


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Refuse nan and inf, which FloatRange lets through."""
    if not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number of seconds (got {value!r})")
    return value


@main.command()
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
    metrics_port: int | None,
    metrics_host: str,
    log_json: bool,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> None:
    """Run submitted jobs: discover them, compete for them, recover abandoned ones.

    Start any number of workers on any number of machines against the same store. The
    first SIGTERM/SIGINT drains (running jobs get --grace seconds, then hand over); a
    second stops at once. Jobs submitted with `ai-lease submit --detach` are picked up.
    """
    from ai_lease.observe.logs import JobLogger, configure_logging, fan_out
    from ai_lease.run.config import RunHooks
    from ai_lease.run.runner import Runner
    from ai_lease.run.worker import Worker

    settings = obj.settings
    metrics = None
    if metrics_port is not None:  # prometheus_client brings its HTTP server: only when asked
        from ai_lease.observe.metrics import Metrics

        metrics = Metrics()
    json_log = JobLogger(configure_logging(json=True), json=True) if log_json else None

    def log(event: Event) -> None:
        who = f" {event.owner_id} token {event.token}" if event.token else ""
        click.echo(
            f"ai-lease worker: {event.kind:<14} {event.key}{who} {redact(event.detail)}".rstrip(),
            err=True,
        )

    async def work(store: LeaseStore) -> None:
        model_provider = obj.provider({"name": provider} if provider else {})
        runner = Runner(
            store,
            provider=model_provider,
            prompts=obj.prompts(),
            config=settings.run_config(),
            hooks=RunHooks(
                on_event=fan_out(
                    metrics, json_log or (lambda e: log(e) if e.kind in _WORKER_LOGGED else None)
                )
            ),
        )
        node = Worker(
            store,
            runner,
            concurrency=concurrency,
            sweep_interval=sweep_interval,
            grace=grace,
            worker_id=worker_id,
            on_event=json_log or log,
        )
        undo = node.install_signal_handlers()
        try:
            await node.run()
        finally:
            undo()
            await model_provider.aclose()

    server = None
    if metrics is not None:
        from ai_lease.observe.metrics import serve_metrics

        server = serve_metrics(metrics, metrics_port or 0, metrics_host)
    try:
        obj.run(work, loop_factory)
    finally:
        if server is not None:
            server.close()


_WORKER_LOGGED = {"acquired", "stalled", "committed", "fenced", "failed", "retry", "released"}


@main.command()
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
        await _warn_data_lost(store)
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
    _end_with_corrupt(corrupt, "marked CORRUPT")


@main.command(short_help="Suggest budgets from recorded stage durations.")
@click.option(
    "--factor",
    default=1.5,
    show_default=True,
    type=float,
    callback=_in_range(0, 100),
    help="Safety factor over the P99.",
)
@click.option(
    "--floor",
    default=1.0,
    show_default=True,
    type=float,
    callback=_in_range(0, 86_400),
    help="Never suggest less (seconds).",
)
@click.option(
    "--min-samples",
    default=20,
    show_default=True,
    type=click.IntRange(1, 1_000_000_000),
    help="Suggest nothing for stages with fewer recorded durations.",
)
@click.option(
    "--write",
    "write_to",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the suggestions as a TOML settings file (use with --config).",
)
@click.option("--force", is_flag=True, help="Overwrite the --write file if it exists.")
@click.pass_obj
def tune(
    obj: Context, factor: float, floor: float, min_samples: int, write_to: Path | None, force: bool
) -> None:
    """Suggest budgets from recorded stage durations: max_no_progress = max(floor, P99 x
    factor) per stage, first_token and idle from the streams' own histograms."""
    from ai_lease.observe.history import DurationHistory, suggest
    from ai_lease.observe.tuning import render_table, render_toml

    corrupt: list[CorruptRecord] = []

    async def fetch(store: LeaseStore) -> Any:
        if not isinstance(store, DurationHistory):
            raise InputError(f"{obj.where} keeps no duration history")
        return await store.load_durations(on_corrupt=corrupt.append)

    suggestions = suggest(obj.run(fetch), factor=factor, floor=floor, min_samples=min_samples)
    click.echo(render_table(suggestions, obj.settings))
    if write_to is not None:
        if write_to.exists() and not force:
            raise InputError(f"{str(write_to)!r} exists: pass --force to overwrite it")
        try:
            write_to.write_text(render_toml(suggestions), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {str(write_to)!r}: {exc.strerror}") from None
        click.echo(f"wrote {write_to} (use it with --config, or copy its tables)", err=True)
    for bad in corrupt:
        click.echo(f"ai-lease: skipped: {bad}", err=True)
    _end_with_corrupt(corrupt, "skipped, named above")
