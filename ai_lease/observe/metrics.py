"""Prometheus metrics with the seed's names, fed by the runner's events.

:class:`Metrics` is an event sink: pass it as ``on_event`` and it turns each
:class:`~ai_lease.lease.events.Event` into the seed's counters and histograms on its own
``CollectorRegistry`` (never the global one), which you can serve or mount:

>>> metrics = Metrics()
>>> runner = Runner(store, provider=provider, hooks=RunHooks(on_event=metrics))  # doctest: +SKIP
>>> app = prometheus_client.make_asgi_app(metrics.registry)          # doctest: +SKIP
>>> server = serve_metrics(metrics, 9464)   # or: http://127.0.0.1:9464/metrics   # doctest: +SKIP

Events come per lease operation and per stage, never per streamed chunk: progress is counted
locally and published with each renewal (``renewed``'s ``value``), so metrics cost nothing on
the hot path. Label values come from small fixed sets (reasons), or are capped (stage,
provider, pipeline names: past :data:`MAX_LABEL_VALUES` distinct values they read ``other``);
a job key, owner id or token never becomes a label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from functools import partial
from types import TracebackType
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

from ai_lease.errors import ConfigError
from ai_lease.failure import FailureKind
from ai_lease.lease.events import Event, EventSink
from ai_lease.observe.slot_metrics import SLOT_KINDS, SlotMetrics
from ai_lease.redaction import redact
from ai_lease.refusal import RENEWAL_REFUSALS, WRITE_REFUSALS

__all__ = ["DEFAULT_STAGES", "MAX_LABEL_VALUES", "Metrics", "MetricsServer", "serve_metrics"]

DEFAULT_STAGES = ("load", "build_prompt", "call_ai", "parse", "persist")
MAX_LABEL_VALUES = 64
OTHER = "other"

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TASK_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
FIRST_TOKEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 15, 30, 60, 120)

# Refusal codes are label values as they are (ai_lease/refusal.py): a reworded
# message never changes a label; anything not a code is counted as OTHER.
RENEW_REASONS = (*(r.value for r in RENEWAL_REFUSALS), OTHER)
FENCE_CODES = frozenset(r.value for r in WRITE_REFUSALS)
STREAM_TIMEOUTS = {
    "FirstTokenTimeout": "first_token",
    "StreamIdleTimeout": "idle",
    "StreamTotalTimeout": "total",
}
# Why a takeover's job was free (Acquired.cause); a takeover event without one reads OTHER.
TAKEOVER_CAUSES = ("expired", "released", "stalled", OTHER)
FAILURE_KINDS = (*(kind.value for kind in FailureKind), OTHER)  # the job_failed_total kinds
# tokens_total{kind}: attrs "<kind>_tokens" of model_call; "reasoning" (thinking tokens,
# where the provider counts them apart) is part of "completion": never add the two.
TOKEN_KINDS = ("prompt", "completion", "reasoning")
# Keeper ticks: one of these per renew interval while a job is owned.
HEARTBEAT_KINDS = frozenset({"renewed", "renew_skipped", "renew_refused", "renew_failed"})
# The termination ladder's signals (ai_lease/run/isolation/ladder.py): "terminated" events' attrs.
TERM_SIGNALS = ("term", "kill")


class _Capped:
    """A label value from an open set, capped at ``limit`` distinct values."""

    def __init__(self, limit: int = MAX_LABEL_VALUES, initial: Iterable[str] = ()) -> None:
        self.limit, self.seen = limit, set(initial)
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        value = value or "unknown"
        if value in self.seen:
            return value
        value = redact(value)  # a label is text leaving the process: no secret in it
        with self._lock:
            if len(self.seen) >= self.limit:
                return OTHER
            self.seen.add(value)
        return value


class Metrics:
    """The seed's metrics on one registry; call it with events (it is an ``EventSink``).

    >>> metrics = Metrics(pipeline="summaries")
    >>> metrics(Event("takeover", "job-1", "node-b#2", 7, attrs={"cause": "expired"}))
    >>> labels = {"pipeline": "summaries", "cause": "expired"}
    >>> metrics.registry.get_sample_value("owner_takeover_total", labels)
    1.0

    ``pipeline`` labels every sample; runners of other pipelines can share the registry
    through :meth:`for_pipeline`. ``stages`` are pre-created with zero counts so alerts on
    ``rate()`` see the first stall.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        pipeline: str = "default",
        stages: Iterable[str] = DEFAULT_STAGES,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pipeline = pipeline
        self._pipelines = _Capped(initial=[pipeline])
        self._stage_names = tuple(stages)
        self._stages = _Capped(initial=self._stage_names)
        self._providers = _Capped()
        self._models = _Capped()
        self._declare()
        self._zero(pipeline, self._stage_names)

    def _declare(self) -> None:
        # prometheus_client drops a trailing "_total" from a counter's name and adds it back
        # in the exposition: these are exactly the seed's names. Every metric is labelled
        # by pipeline, some by one more label.
        counter = partial(_counter, self.registry)
        histogram = partial(_histogram, self.registry)
        self.heartbeat = counter("owner_heartbeat_total", "Lease keeper ticks (renewal decisions).")
        self.renewed = counter("owner_lease_renew_total", "Lease renewals the store accepted.")
        self.renew_rejected = counter(
            "owner_lease_renew_rejected_total",
            "Lease renewals the store refused, by reason.",
            "reason",
        )
        self.progress = counter(
            "owner_progress_update_total", "Real progress events, published with each renewal."
        )
        self.no_progress = counter(
            "owner_no_progress_timeout_total",
            "Owners that stalled: no progress within the stage's max_no_progress.",
            "stage",
        )
        self.takeover = counter(
            "owner_takeover_total",
            "Jobs another node acquired from a previous owner, by cause (expired, released, "
            "stalled); a retry by the same node is an attempt, not a takeover.",
            "cause",
        )
        self.attempts = counter(
            "job_attempts_total", "Acquisitions that started an attempt (same-node retries too)."
        )
        self.failed = counter(
            "job_failed_total",
            "Jobs this process failed or found FAILED, by kind (timed_out, provider_refused, "
            "bad_input, gave_up, queue_deadline, error).",
            "kind",
        )
        self.fencing_rejected = counter(
            "owner_fencing_rejected_total",
            "Writes rejected for a stale (token, owner) fence, by reason.",
            "reason",
        )
        self.stage_duration = histogram(
            "owner_stage_duration",
            "Seconds each stage took (completed stages).",
            STAGE_BUCKETS,
            "stage",
        )
        self.task_duration = histogram(
            "owner_task_total_duration",
            "Seconds from acquiring a job to committing its result.",
            TASK_BUCKETS,
        )
        self.first_token = histogram(
            "owner_ai_first_token_duration",
            "Seconds from the model call to its first content.",
            FIRST_TOKEN_BUCKETS,
            "provider",
        )
        self._declare_stream_counters()
        self._declare_usage()

    def _declare_usage(self) -> None:
        self.tokens = _counter(
            self.registry,
            "tokens_total",
            "Model tokens used by successful calls, by provider, model and kind "
            "(prompt, completion, reasoning; reasoning is part of completion).",
            "provider",
            "model",
            "kind",
        )
        self.slots = SlotMetrics(self.registry, _Capped())

    def _declare_stream_counters(self) -> None:
        counter = partial(_counter, self.registry)
        self.stream_idle = counter(
            "owner_stream_idle_timeout_total",
            "Model streams that went quiet for longer than the idle budget.",
        )
        self.false_takeover = counter(
            "owner_false_takeover_total",
            "Stalled thread stages that finished after all: slow, not stuck (budget too tight).",
            "stage",
        )
        self.stream_timeout = counter(
            "owner_stream_timeout_total",
            "Model stream timeouts of every kind (first_token, idle, total).",
            "kind",
        )
        self.progress_suspicion = counter(
            "owner_progress_suspicion_total",
            "Model streams whose silence reached the φ-accrual threshold, by provider.",
            "provider",
        )
        self.terminated = counter(
            "owner_terminated_total",
            "Signals the termination ladder sent to a stuck job's child process: every "
            "ladder sends term, kill counts the children still there after the grace.",
            "signal",
        )

    def _zero(self, pipeline: str, stages: Iterable[str]) -> None:
        """Create the fixed-set series at 0, so the first increment shows in ``rate()``."""
        for metric in (self.heartbeat, self.renewed, self.progress, self.attempts):
            metric.labels(pipeline)
        for cause in TAKEOVER_CAUSES:
            self.takeover.labels(pipeline, cause)
        self.task_duration.labels(pipeline)
        self.stream_idle.labels(pipeline)
        for reason in RENEW_REASONS:
            self.renew_rejected.labels(pipeline, reason)
        for reason in {*FENCE_CODES, OTHER}:
            self.fencing_rejected.labels(pipeline, reason)
        for kind in {*STREAM_TIMEOUTS.values(), OTHER}:
            self.stream_timeout.labels(pipeline, kind)
        for sig in TERM_SIGNALS:
            self.terminated.labels(pipeline, sig)
        for stage in stages:
            self.no_progress.labels(pipeline, stage)
            self.false_takeover.labels(pipeline, stage)
            self.stage_duration.labels(pipeline, stage)

    # -- the sink -------------------------------------------------------------------------------

    def __call__(self, event: Event) -> None:
        self.observe(event, self.pipeline)

    def for_pipeline(self, name: str) -> EventSink:
        """A sink for the same registry that labels samples with pipeline ``name``."""
        pipeline = self._pipelines(name)
        self._zero(pipeline, self._stage_names)
        return partial(self.observe, pipeline=pipeline)

    def observe(self, event: Event, pipeline: str) -> None:
        """Count one event (anything that is not about the seed's metrics is ignored)."""
        if event.kind in HEARTBEAT_KINDS and event.idle_s is not None:  # from the keeper
            self.heartbeat.labels(pipeline).inc()
        handler = _HANDLERS.get(event.kind)
        if handler is not None:
            handler(self, event, pipeline)
        elif event.kind in SLOT_KINDS:
            self.slots.observe(event, pipeline)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what ``GET /metrics`` returns)."""
        return generate_latest(self.registry)

    # -- one handler per event kind -------------------------------------------------------------

    def _renewed(self, event: Event, pipeline: str) -> None:
        self.renewed.labels(pipeline).inc()
        if event.value:  # progress since the last renewal, counted locally
            self.progress.labels(pipeline).inc(event.value)

    def _renew_refused(self, event: Event, pipeline: str) -> None:
        reason = event.detail if event.detail in RENEW_REASONS else OTHER
        self.renew_rejected.labels(pipeline, reason).inc()

    def _stalled(self, event: Event, pipeline: str) -> None:
        self.no_progress.labels(pipeline, self._stages(event.stage)).inc()

    def _takeover(self, event: Event, pipeline: str) -> None:
        cause = (event.attrs or {}).get("cause")
        self.takeover.labels(pipeline, cause if cause in TAKEOVER_CAUSES else OTHER).inc()

    def _acquired(self, event: Event, pipeline: str) -> None:
        self.attempts.labels(pipeline).inc()

    def _failed(self, event: Event, pipeline: str) -> None:
        kind = (event.attrs or {}).get("kind")
        self.failed.labels(pipeline, kind if kind in FAILURE_KINDS else OTHER).inc()

    def _false_takeover(self, event: Event, pipeline: str) -> None:
        self.false_takeover.labels(pipeline, self._stages(event.stage)).inc()

    def _fenced(self, event: Event, pipeline: str) -> None:
        code = (event.attrs or {}).get("reason")
        reason = code if code in FENCE_CODES else OTHER
        self.fencing_rejected.labels(pipeline, reason).inc()

    def _stage_done(self, event: Event, pipeline: str) -> None:
        if event.value is not None:
            self.stage_duration.labels(pipeline, self._stages(event.stage)).observe(event.value)

    def _committed(self, event: Event, pipeline: str) -> None:
        if event.value is not None:
            self.task_duration.labels(pipeline).observe(event.value)
        # Progress after the last renewal, when the runner reports it (attrs["progress"]).
        unreported = (event.attrs or {}).get("progress")
        if isinstance(unreported, int | float) and unreported > 0:
            self.progress.labels(pipeline).inc(unreported)

    def _first_token(self, event: Event, pipeline: str) -> None:
        if event.value is not None:
            provider = self._providers(event.detail)
            self.first_token.labels(pipeline, provider).observe(event.value)

    def _model_call(self, event: Event, pipeline: str) -> None:
        attrs = event.attrs or {}
        provider = self._providers(str(attrs.get("provider") or event.detail))
        model = self._models(str(attrs.get("model") or ""))
        for kind in TOKEN_KINDS:
            used = attrs.get(f"{kind}_tokens")
            if isinstance(used, int | float) and used > 0:
                self.tokens.labels(pipeline, provider, model, kind).inc(used)

    def _progress_suspected(self, event: Event, pipeline: str) -> None:
        provider = self._providers(str((event.attrs or {}).get("provider") or event.detail))
        self.progress_suspicion.labels(pipeline, provider).inc()

    def _stream_timeout(self, event: Event, pipeline: str) -> None:
        kind = STREAM_TIMEOUTS.get(event.detail, OTHER)
        self.stream_timeout.labels(pipeline, kind).inc()
        if kind == "idle":
            self.stream_idle.labels(pipeline).inc()

    def _terminated(self, event: Event, pipeline: str) -> None:
        sig = (event.attrs or {}).get("signal")
        if sig in TERM_SIGNALS:
            self.terminated.labels(pipeline, sig).inc()


_HANDLERS: dict[str, Callable[[Metrics, Event, str], None]] = {
    "renewed": Metrics._renewed,
    "renew_refused": Metrics._renew_refused,
    "stalled": Metrics._stalled,
    "takeover": Metrics._takeover,
    "acquired": Metrics._acquired,
    "failed": Metrics._failed,
    "false_takeover": Metrics._false_takeover,
    "fenced": Metrics._fenced,
    "stage_done": Metrics._stage_done,
    "committed": Metrics._committed,
    "first_token": Metrics._first_token,
    "model_call": Metrics._model_call,
    "stream_timeout": Metrics._stream_timeout,
    "progress_suspected": Metrics._progress_suspected,
    "terminated": Metrics._terminated,
}


# -- serving --------------------------------------------------------------------------------------


def _counter(registry: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    """A counter on ``registry``, labelled by pipeline and ``labels``."""
    return Counter(name, doc, ["pipeline", *labels], registry=registry)


def _histogram(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...], *labels: str
) -> Histogram:
    """A histogram on ``registry`` with ``buckets``, labelled by pipeline and ``labels``."""
    return Histogram(name, doc, ["pipeline", *labels], registry=registry, buckets=buckets)


class MetricsServer:
    """A running ``/metrics`` HTTP server (a daemon thread); :meth:`close` stops it."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = host, int(server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def serve_metrics(metrics: Metrics, port: int, host: str = "127.0.0.1") -> MetricsServer:
    """Serve ``metrics`` at ``http://host:port/metrics`` from a daemon thread.

    >>> with serve_metrics(Metrics(), 0) as server:     # port 0: any free port
    ...     print(server.url)                             # doctest: +ELLIPSIS
    http://127.0.0.1:.../metrics

    Binds only to loopback by default; pass ``host="0.0.0.0"`` for a scraper on another host.
    """
    try:
        server, thread = start_http_server(port, host, registry=metrics.registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}): "
            "choose another port or host"
        ) from None
    return MetricsServer(server, thread, host)
