"""OpenTelemetry spans, when ``opentelemetry-api`` is installed (``pip install ai_lease[otel]``).

A job attempt becomes a span (``ai_lease.job``) from acquiring the lease to committing,
failing or losing it; each stage a child span (``ai_lease.stage``), with the first-token
time and token counts of the model call as attributes. Spans are built from the runner's
events (after the fact, with their real start and end times), so nothing is traced per
chunk. Without the package nothing is imported and :func:`tracing_sink` returns None.
Like any library, ai_lease only uses the API: spans go nowhere until the application
configures an SDK tracer provider.
"""

from __future__ import annotations

from typing import Any

from ai_lease.lease.events import Event, EventSink

__all__ = ["tracing_sink"]

# Every way an attempt ends: a span left open would leak (and never be exported).
_ENDS = {
    "committed": "ok",
    "failed": "error",
    "fenced": "error",
    "retry": "error",
    "released": "error",  # a failure handed back (an interrupted owner's is no error)
    "store_unavailable": "error",  # could not even release or fail: the lease lapses
}


def tracing_sink(tracer: Any = None) -> EventSink | None:
    """An event sink that emits spans, or None when OpenTelemetry is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return _Spans(tracer or trace.get_tracer("ai_lease"), trace)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class _Spans:
    # The event kinds spans are made of (no other event is built for this sink).
    kinds = frozenset({"acquired", "stage_done", "first_token", "model_call", *_ENDS})

    def __init__(self, tracer: Any, trace: Any) -> None:
        self.tracer, self.trace = tracer, trace
        self.jobs: dict[tuple[str, int | None], Any] = {}

    def __call__(self, event: Event) -> None:
        job = (event.key, event.token)
        if event.kind == "acquired":
            self.jobs[job] = self.tracer.start_span(
                "ai_lease.job",
                start_time=_ns(event.at),
                attributes={
                    "ai_lease.key": event.key,
                    "ai_lease.token": event.token or 0,
                    "ai_lease.owner": event.owner_id or "",
                },
            )
            return
        span = self.jobs.get(job)
        if span is None:
            return
        if event.kind not in _ENDS and not span.is_recording():
            return  # no SDK, or sampled out: its stages and attributes would go nowhere
        if event.kind == "stage_done" and event.value is not None:
            context = self.trace.set_span_in_context(span)
            child = self.tracer.start_span(
                "ai_lease.stage",
                context=context,
                start_time=_ns(event.at - event.value),
                attributes={"ai_lease.stage": event.stage or ""},
            )
            child.end(end_time=_ns(event.at))
        elif event.kind == "first_token" and event.value is not None:
            span.set_attribute("ai_lease.first_token_s", event.value)
        elif event.kind == "model_call" and event.attrs:
            for name, value in event.attrs.items():
                span.set_attribute(f"ai_lease.{name}", value)
        elif event.kind in _ENDS:
            interrupted = (event.attrs or {}).get("reason") == "interrupted"
            if _ENDS[event.kind] == "error" and not interrupted:
                span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, event.detail))
            span.set_attribute("ai_lease.outcome", event.kind)
            span.end(end_time=_ns(event.at))
            del self.jobs[job]
