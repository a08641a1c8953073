"""OpenTelemetry spans per job and stage, and nothing imported when it is not installed."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ai_lease import LeaseStore, LeaseTimings, StoreUnavailable
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.observe.tracing import tracing_sink
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, ScriptedProvider


async def test_job_and_stage_spans_with_first_token_and_tokens(store: LeaseStore) -> None:
    """One job span (with first-token time and token counts) and a child span per stage."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Runner(store, provider=ScriptedProvider(["a", "b"]), config=RunConfig(trace=False))
    runner.tracing = tracing_sink(provider.get_tracer("test"))
    await runner.run(Job("k", input="x"))
    spans = exporter.get_finished_spans()
    jobs = [s for s in spans if s.name == "ai_lease.job"]
    stages = [s for s in spans if s.name == "ai_lease.stage"]
    assert len(jobs) == 1
    job = jobs[0]
    assert (
        job.attributes["ai_lease.key"] == "k" and job.attributes["ai_lease.outcome"] == "committed"
    )
    assert job.attributes["ai_lease.first_token_s"] >= 0
    assert (
        job.attributes["ai_lease.chunks"] == 2 and job.attributes["ai_lease.completion_tokens"] == 2
    )
    assert [s.attributes["ai_lease.stage"] for s in stages] == [
        "load",
        "build_prompt",
        "call_ai",
        "parse",
        "persist",
    ]
    assert all(s.parent is not None and s.parent.span_id == job.context.span_id for s in stages)
    assert all(job.start_time <= s.start_time <= s.end_time <= job.end_time for s in stages)


def test_without_opentelemetry_nothing_is_imported(tmp_path: Path) -> None:
    """With OpenTelemetry absent a job runs and no opentelemetry module is loaded."""
    code = f"""
import sys, asyncio
sys.modules["opentelemetry"] = None  # as if it were not installed
from ai_lease import Job, Runner, open_store
from ai_lease.testing.scripted import ScriptedProvider
async def main():
    store = open_store("sqlite:///{tmp_path}/t.db")
    runner = Runner(store, provider=ScriptedProvider(["x"]))
    assert runner.tracing is None
    record = await runner.run(Job("k", input="x"))
    await store.aclose()
    print(record.output)
asyncio.run(main())
loaded = [m for m in sys.modules if m.startswith("opentelemetry.")]
assert not loaded, loaded
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "x"


class _NoRelease:
    """A store whose release and fail never reach it (the rest is the real store)."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    async def release(self, fence: object, **kwargs: object) -> bool:
        raise StoreUnavailable("test", "release", "unreachable")

    async def fail(self, fence: object, reason: str, **facts: object) -> object:
        raise StoreUnavailable("test", "fail", "unreachable")


async def test_spans_of_cancelled_and_store_unavailable_runs_are_ended(store: LeaseStore) -> None:
    """20 runs cancelled mid-call (stepped down) and 2 whose step-down cannot reach the
    store: every job span is ended (exported), none left open."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    timings = LeaseTimings(
        ttl=2.0, renew_interval=0.5, op_timeout=0.2, poll_interval=0.05, self_fence_margin=0.5
    )
    for i in range(22):
        calling = asyncio.Event()

        def on_event(event: Event, calling: asyncio.Event = calling) -> None:
            if event.kind == "stage" and event.stage == "call_ai":
                calling.set()

        runner = Runner(
            store if i < 20 else _NoRelease(store),  # type: ignore[arg-type]
            provider=ScriptedProvider(["x", Pause(30)]),
            config=RunConfig(timings=timings, trace=False),
            hooks=RunHooks(on_event=on_event),
        )
        runner.tracing = tracing_sink(provider.get_tracer("test"))
        run = asyncio.create_task(runner.run(Job(f"k{i}", input="x")))
        await asyncio.wait_for(calling.wait(), 5)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    jobs = [s for s in exporter.get_finished_spans() if s.name == "ai_lease.job"]
    outcomes = [s.attributes["ai_lease.outcome"] for s in jobs]
    assert outcomes == ["released"] * 20 + ["store_unavailable"] * 2
    assert all(s.status.status_code is not StatusCode.ERROR for s in jobs[:20])


async def test_a_failed_attempt_span_is_an_error_and_a_cancelled_one_is_not(
    store: LeaseStore,
) -> None:
    """A failed attempt (released with its error) ends its span with status ERROR (an
    interrupted one does not: see above)."""
    from ai_lease import ProviderError, RetryPolicy

    class Broken:
        name = "broken"

        async def stream(self, request):  # type: ignore[no-untyped-def]
            raise ProviderError("HTTP 503", retryable=True, status=503)
            yield  # pragma: no cover

        async def complete(self, request):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        async def aclose(self) -> None:
            return None

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Runner(
        store,
        provider=Broken(),  # type: ignore[arg-type]
        config=RunConfig(
            retry=RetryPolicy(attempts=1), call_retry=RetryPolicy(attempts=1), trace=False
        ),
    )
    runner.tracing = tracing_sink(provider.get_tracer("test"))
    with pytest.raises(Exception, match="503"):
        await runner.run(Job("k", input="x"))
    [job] = [s for s in exporter.get_finished_spans() if s.name == "ai_lease.job"]
    assert job.status.status_code is StatusCode.ERROR and "503" in (job.status.description or "")
