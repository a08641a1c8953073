"""OpenTelemetry spans per job and stage, and nothing imported when it is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ai_lease import LeaseStore
from ai_lease.job import Job
from ai_lease.runner import Runner
from ai_lease.testing.scripted import ScriptedProvider
from ai_lease.tracing import tracing_sink


async def test_job_and_stage_spans_with_first_token_and_tokens(store: LeaseStore) -> None:
    """One job span (with first-token time and token counts) and a child span per stage."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner = Runner(store, provider=ScriptedProvider(["a", "b"]), trace=False)
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
