"""Prometheus metrics: the seed's names, fed by events, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ai_lease import ConfigError, LeaseStore, LeaseTimings, StageBudget
from ai_lease import refusal as refusal_module
from ai_lease.errors import FencingRejected
from ai_lease.job import Job
from ai_lease.lease.base import Acquired, Fence
from ai_lease.lease.events import Event, EventSink
from ai_lease.observe.logs import fan_out
from ai_lease.observe.metrics import DEFAULT_STAGES, MAX_LABEL_VALUES, Metrics, serve_metrics
from ai_lease.refusal import WRITE_REFUSALS, Refusal
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.context import StageContext
from ai_lease.run.pipeline import Pipeline
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall
from tests.harness.redis_server import free_port

SEED_COUNTERS = (
    "owner_heartbeat_total",
    "owner_lease_renew_total",
    "owner_lease_renew_rejected_total",
    "owner_progress_update_total",
    "owner_no_progress_timeout_total",
    "owner_takeover_total",
    "owner_fencing_rejected_total",
    "owner_stream_idle_timeout_total",
)
SEED_HISTOGRAMS = (
    "owner_stage_duration",
    "owner_task_total_duration",
    "owner_ai_first_token_duration",
)
FAST = LeaseTimings(
    ttl=1.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.2,
    stage_budgets={"call_ai": StageBudget(0.5, 10)},
)
P = {"pipeline": "default"}


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, P | labels)
    return 0.0 if value is None else value


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text -> sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **want: str) -> float:
    return sum(v for labels, v in samples[name] if want.items() <= labels.items())


# -- names and mapping ---------------------------------------------------------------------------


def test_exposed_names_are_exactly_the_seeds() -> None:
    """The exposition declares every seed metric under its exact name and type."""
    text = Metrics().exposition().decode()
    for name in SEED_COUNTERS:
        assert f"# TYPE {name} counter\n" in text
    for name in SEED_HISTOGRAMS:
        assert f"# TYPE {name} histogram\n" in text


def test_default_stages_match_the_default_pipeline() -> None:
    """The pre-created stage series are the default pipeline's stages."""
    assert DEFAULT_STAGES == tuple(s.name for s in Pipeline.default().stages)


def test_events_map_to_the_seed_metrics() -> None:
    """Keeper ticks, refusals, stalls, takeovers, fencing, durations and timeouts count."""
    m = Metrics()
    tick = {"key": "k", "owner_id": "o", "token": 3, "stage": "call_ai", "idle_s": 0.1}
    for event in [
        Event("renewed", **tick, value=40.0),
        Event("renewed", **tick, value=0.0),
        Event("renew_skipped", **tick, detail="no progress for 1.2s (budget 1s)"),
        Event("renew_refused", **tick, detail="no_progress"),
        Event("renew_refused", **tick, detail="something new"),
        Event("renew_failed", **tick, detail="store unreachable"),
        Event("renew_failed", "k", detail="store unreachable while competing"),  # not a tick
        Event("stalled", **tick, detail="expire: …"),
        Event("acquired", "k", "o2", 4, detail="attempt 2 (takeover)"),
        Event("takeover", "k", "o2", 4, detail="previous attempts 1", attrs={"cause": "stalled"}),
        Event("false_takeover", **tick | {"stage": "parse"}, detail="slow_not_stuck", value=2.0),
        Event("stage_done", **tick | {"stage": "parse"}, value=0.02),
        Event("committed", "k", "o", 3, value=12.5, attrs={"progress": 2}),
        Event("first_token", **tick, detail="openai-compatible", value=0.8),
        Event("stream_timeout", **tick, detail="StreamIdleTimeout", value=30.0),
        Event("stream_timeout", **tick, detail="FirstTokenTimeout", value=30.0),
    ]:
        m(event)
    assert sample(m, "owner_heartbeat_total") == 6  # the keeper's six ticks
    assert sample(m, "owner_lease_renew_total") == 2
    assert sample(m, "owner_progress_update_total") == 42  # 40 at renewals, 2 at commit
    assert sample(m, "owner_lease_renew_rejected_total", reason="no_progress") == 1
    assert sample(m, "owner_lease_renew_rejected_total", reason="other") == 1
    assert sample(m, "owner_no_progress_timeout_total", stage="call_ai") == 1
    assert sample(m, "owner_no_progress_timeout_total", stage="load") == 0
    assert sample(m, "owner_takeover_total", cause="stalled") == 1
    assert sample(m, "owner_takeover_total", cause="expired") == 0
    assert sample(m, "job_attempts_total") == 1
    assert sample(m, "owner_false_takeover_total", stage="parse") == 1
    assert sample(m, "owner_stage_duration_count", stage="parse") == 1
    assert sample(m, "owner_stage_duration_sum", stage="parse") == pytest.approx(0.02)
    assert sample(m, "owner_task_total_duration_sum") == 12.5
    assert sample(m, "owner_ai_first_token_duration_count", provider="openai-compatible") == 1
    assert sample(m, "owner_stream_idle_timeout_total") == 1
    assert sample(m, "owner_stream_timeout_total", kind="first_token") == 1


def _fenced(m: Metrics, exc: FencingRejected) -> None:
    """What the runner emits for a rejected write (``attrs["reason"]`` is the code)."""
    m(Event("fenced", "k", "a", 3, detail=str(exc), attrs={"reason": exc.code}))


def test_fencing_rejections_are_counted_by_reason() -> None:
    """A fenced write counts under its FencingRejected code; anything else is ``other``."""
    m = Metrics()
    held, current = Fence("k", "a", 3), Fence("k", "b", 4)
    for refusal in (Refusal.NEWER_OWNER, Refusal.ALREADY_COMMITTED):
        _fenced(m, FencingRejected("k", held, current, refusal))
    m(Event("fenced", "k", "a", 3, detail="no code given"))
    assert sample(m, "owner_fencing_rejected_total", reason="newer_owner") == 1
    assert sample(m, "owner_fencing_rejected_total", reason="already_committed") == 1
    assert sample(m, "owner_fencing_rejected_total", reason="other") == 1


@pytest.mark.parametrize("refusal", WRITE_REFUSALS)
def test_fencing_label_follows_the_refusal_not_its_message(
    refusal: Refusal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The label is the refusal's code: a reworded message still counts under it."""
    reworded = {**refusal_module.MESSAGES, refusal: "some brand-new wording"}
    monkeypatch.setattr(refusal_module, "MESSAGES", reworded)
    exc = FencingRejected("k", Fence("k", "a", 3), None, refusal)
    assert "some brand-new wording" in str(exc)
    m = Metrics()
    _fenced(m, exc)
    assert sample(m, "owner_fencing_rejected_total", reason=refusal.value) == 1
    assert sample(m, "owner_fencing_rejected_total", reason="other") == 0


def test_labels_never_carry_keys_owners_or_tokens() -> None:
    """Label values come from bounded sets: never a job key, owner id or token."""
    m = Metrics()
    keys, owners = set(), set()
    for i in range(3 * MAX_LABEL_VALUES):
        key, owner = f"job-{i}", f"node-{i}#1.ab"
        keys.add(key)
        owners.add(owner)
        common = {"key": key, "owner_id": owner, "token": 1000 + i, "idle_s": 0.5}
        m(Event("stalled", **common, stage=f"stage-{i}"))  # an open set of stage names
        m(Event("first_token", **common, stage="call_ai", detail=f"provider-{i}", value=0.1))
        m(Event("renew_refused", **common, stage="call_ai", detail=key))
        m(Event("fenced", **common, detail=f"job {key!r}: fence token {1000 + i} is stale"))
    values: dict[str, set[str]] = collections.defaultdict(set)
    for family in m.registry.collect():
        for s in family.samples:
            for name, value in s.labels.items():
                values[name].add(value)
    forbidden = keys | owners | {str(1000 + i) for i in range(3 * MAX_LABEL_VALUES)}
    assert not forbidden & set().union(*values.values())
    assert len(values["stage"]) <= MAX_LABEL_VALUES + 1 and "other" in values["stage"]
    assert len(values["provider"]) <= MAX_LABEL_VALUES + 1
    assert values["pipeline"] == {"default"}


def test_pipelines_share_one_registry() -> None:
    """``for_pipeline`` labels another pipeline's samples on the same registry."""
    m = Metrics()
    etl = m.for_pipeline("etl")
    etl(Event("takeover", "k", "o", 2))  # no cause given: counted as other
    etl_other = {"pipeline": "etl", "cause": "other"}
    assert m.registry.get_sample_value("owner_takeover_total", etl_other) == 1
    assert sample(m, "owner_takeover_total", cause="other") == 0


# -- tokens ------------------------------------------------------------------------------------


def test_model_calls_count_tokens_by_provider_model_and_kind() -> None:
    """``model_call`` adds its prompt and completion tokens; a call naming no model counts
    under ``unknown``, a zero count adds nothing."""
    m = Metrics()
    usage = {"provider": "openai-compatible", "model": "m-1", "chunks": 4, "finish_reason": ""}
    m(
        Event(
            "model_call",
            "k",
            detail="x",
            attrs=usage | {"prompt_tokens": 3, "completion_tokens": 5},
        )
    )
    m(
        Event(
            "model_call",
            "k",
            detail="x",
            attrs=usage | {"prompt_tokens": 2, "completion_tokens": 0},
        )
    )
    m(Event("model_call", "k", detail="local", attrs={"prompt_tokens": 7, "model": ""}))
    tokens = partial(sample, m, "tokens_total", provider="openai-compatible", model="m-1")
    assert tokens(kind="prompt") == 5
    assert tokens(kind="completion") == 5
    assert sample(m, "tokens_total", provider="local", model="unknown", kind="prompt") == 7
    assert sample(m, "tokens_total", provider="local", model="unknown", kind="completion") == 0


async def test_a_run_counts_the_tokens_its_model_reported(sqlite_store: LeaseStore) -> None:
    """The call_ai stage names the provider and the job's model: the usage lands there."""
    metrics = Metrics()
    runner = Runner(
        sqlite_store, provider=ScriptedProvider(["a", "b", "c"]), hooks=RunHooks(on_event=metrics)
    )
    await runner.run(Job("tok", input="x", model="model-7"))
    tokens = partial(sample, metrics, "tokens_total", provider="scripted", model="model-7")
    assert tokens(kind="completion") == 3  # the scripted stream reports one token per chunk
    assert tokens(kind="prompt") == 1


# -- the dashboard: its panels use only names that are registered ---------------------------------

DASHBOARD = Path(__file__).parent.parent / "docs" / "grafana-dashboard.json"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
PROMQL_WORDS |= {"and", "or", "unless", "inf", "nan"}


def registered_names() -> set[str]:
    """Every sample name Metrics and the store collector can expose."""
    from ai_lease.observe.store_metrics import StoreCollector

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum")}
    suffixes["histogram"] += ("_created",)
    loop = asyncio.new_event_loop()
    try:
        families = [*Metrics().registry.collect(), *StoreCollector(None, loop).describe()]
    finally:
        loop.close()
    names = set()
    for family in families:
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not functions, labels or keywords)."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)  # label matchers, ranges
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*(?!\s*\()\b", bare)
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"[\d.]+", w)}


def dashboard_exprs() -> list[str]:
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    return exprs


def test_metric_names_reads_promql() -> None:
    """The extractor finds the metrics, and only them (so the next test can fail)."""
    expr = (
        "histogram_quantile(0.95, sum by (le, stage) (rate(owner_stage_duration_bucket"
        '{pipeline=~"$pipeline"}[$__rate_interval]))) / max(queue_due) or vector(0)'
    )
    assert metric_names(expr) == {"owner_stage_duration_bucket", "queue_due"}
    assert "no_such_metric" in metric_names("sum(rate(no_such_metric[5m]))")


def test_dashboard_uses_only_registered_metric_names() -> None:
    """Every name a panel reads is one Metrics or the store collector registers; every new
    operator metric, and the takeover, fencing, stall and renewal counters, has a panel."""
    used = set().union(*map(metric_names, dashboard_exprs()))
    assert used <= registered_names(), used - registered_names()
    wanted = {"jobs", "queue_due", "queue_scheduled", "worker_running_jobs", "tokens_total"}
    wanted |= {"store_up", "leases_live", "leases_lapsed", "owner_takeover_total"}
    wanted |= {"job_attempts_total"}
    wanted |= {"owner_fencing_rejected_total", "owner_no_progress_timeout_total"}
    wanted |= {"owner_lease_renew_total", "owner_lease_renew_rejected_total"}
    assert wanted <= used, wanted - used


# -- hot path ------------------------------------------------------------------------------------


async def test_events_do_not_grow_with_streamed_chunks(sqlite_store: LeaseStore) -> None:
    """A 1,000-chunk stream emits exactly the events of a 10-chunk one: no per-chunk cost."""
    counts = []
    for chunks in (10, 1000):
        kinds: collections.Counter[str] = collections.Counter()
        metrics = Metrics()
        runner = Runner(
            sqlite_store,
            provider=ScriptedProvider(["x"] * chunks),
            hooks=RunHooks(
                on_event=fan_out(metrics, lambda e, kinds=kinds: kinds.update([e.kind]))
            ),
        )
        record = await runner.run(Job(f"k{chunks}", input="x"))
        assert record.output == "x" * chunks
        assert sample(metrics, "owner_ai_first_token_duration_count", provider="scripted") == 1
        counts.append(kinds)
    assert counts[0] == counts[1]
    assert sum(counts[1].values()) < 20


# -- the done-when: a zombie takeover, scraped over HTTP --------------------------------------


async def steal(store: LeaseStore, fence: Fence, result: str) -> None:
    """Another node gets the lease out from under ``fence`` and commits ``result``."""
    await store.release(fence)
    outcome = await store.acquire(fence.key, "thief", ttl=30.0, max_no_progress=30.0)
    assert isinstance(outcome, Acquired)
    await store.commit(outcome.fence, orjson.dumps(result).decode())


async def zombie_taken_over(store: LeaseStore, sink: EventSink) -> None:
    """The seed's zombie: its stream hangs with the heartbeat alive; another node takes over."""
    stalled = asyncio.Event()
    on_event = fan_out(sink, lambda e: stalled.set() if e.kind == "stalled" else None)
    zombie = Runner(
        store,
        provider=ScriptedProvider(["x", Stall()]),
        config=RunConfig(timings=FAST, node_id="z"),
        hooks=RunHooks(on_event=on_event),
    )
    good = Runner(
        store,
        provider=ScriptedProvider(["good"]),
        config=RunConfig(timings=FAST),
        hooks=RunHooks(on_event=on_event),
    )
    zombie_run = asyncio.create_task(zombie.run(Job("zombie", input="x")))
    await asyncio.sleep(0.1)  # real: a takeover on the SQLite store (its thread, its clock)
    good_run = asyncio.create_task(good.run(Job("zombie", input="x")))
    await asyncio.wait_for(stalled.wait(), 5)
    zombie_run.cancel()  # the zombie's node stays out of the race from here on
    assert (await good_run).output == "good"
    with pytest.raises(asyncio.CancelledError):
        await zombie_run


async def renewal_refused(store: LeaseStore, sink: EventSink) -> None:
    """An owner whose lease was taken while it streams: its next renewal is refused."""
    renewed: asyncio.Future[Fence] = asyncio.get_running_loop().create_future()

    def on_event(event: Event) -> None:
        if event.kind == "renewed" and not renewed.done():
            renewed.set_result(Fence(event.key, event.owner_id or "", event.token or 0))

    runner = Runner(
        store,
        provider=ScriptedProvider(["a", Pause(0.05)] * 100),
        config=RunConfig(timings=FAST),
        hooks=RunHooks(on_event=fan_out(sink, on_event)),
    )
    run = asyncio.create_task(runner.run(Job("stolen", input="x")))
    await steal(store, await asyncio.wait_for(renewed, 5), "the thief's")
    assert (await asyncio.wait_for(run, 5)).output == "the thief's"


async def late_write_fenced(store: LeaseStore, sink: EventSink) -> None:
    """The lease is lost between the owner's last local check and its write: fenced."""

    async def hook(ctx: StageContext, value: object) -> None:
        await steal(store, ctx.fence, "the newer owner's")

    slow_keeper = LeaseTimings(ttl=10, renew_interval=2, op_timeout=1, poll_interval=0.05)
    runner = Runner(
        store,
        provider=ScriptedProvider(["late"]),
        config=RunConfig(timings=slow_keeper),
        hooks=RunHooks(persist_hook=hook, on_event=sink),
    )
    assert (await runner.run(Job("late", input="x"))).output == "the newer owner's"


async def test_scrape_after_zombie_takeover(sqlite_store: LeaseStore) -> None:
    """GET /metrics after a zombie takeover shows the stall, the takeover, the refused
    renewal and the fenced write, and every default stage's duration."""
    metrics = Metrics()
    await zombie_taken_over(sqlite_store, metrics)
    await renewal_refused(sqlite_store, metrics)
    await late_write_fenced(sqlite_store, metrics)
    with serve_metrics(metrics, 0) as server:
        async with httpx.AsyncClient() as client:
            response = await client.get(server.url)
    assert response.status_code == 200
    got = parse(response.text)
    assert total(got, "owner_lease_renew_rejected_total", reason="not_owner") >= 1
    assert total(got, "owner_no_progress_timeout_total", stage="call_ai") == 1
    assert total(got, "owner_no_progress_timeout_total") == 1
    assert total(got, "owner_takeover_total") == 1
    assert total(got, "owner_fencing_rejected_total", reason="already_committed") >= 1
    assert total(got, "owner_lease_renew_total") >= 1
    assert total(got, "owner_heartbeat_total") > total(got, "owner_lease_renew_total")
    assert total(got, "owner_progress_update_total") >= 1
    assert total(got, "owner_task_total_duration_count") >= 1
    for stage in DEFAULT_STAGES:
        assert total(got, "owner_stage_duration_count", stage=stage) > 0, stage


def test_port_in_use_is_a_config_error() -> None:
    """A taken port fails with a clear ConfigError, not a traceback."""
    with serve_metrics(Metrics(), 0) as server:
        with pytest.raises(ConfigError, match=f"127.0.0.1:{server.port}"):
            serve_metrics(Metrics(), server.port)


# -- the CLI -------------------------------------------------------------------------------------


async def submit(db: Path, key: str) -> None:
    from ai_lease import open_store

    store = open_store(f"sqlite:///{db}")
    try:
        await Runner(store).submit(Job(key, input="One. Two. Three.", prompt_text="{{ input }}"))
    finally:
        await store.aclose()


def start_worker(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    db = tmp_path / "ai-lease.db"
    command = ["--store", f"sqlite:///{db}", "worker", "--sweep-interval", "0.1", *args]
    return subprocess.Popen(
        [sys.executable, "-m", "ai_lease", *command],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(worker: subprocess.Popen[str]) -> tuple[int, str]:
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=30)
    return worker.returncode, err


def test_worker_serves_metrics(tmp_path: Path) -> None:
    """`ai-lease worker --metrics-port` serves /metrics; a finished job shows up in it."""
    asyncio.run(submit(tmp_path / "ai-lease.db", "cli-job"))
    port = free_port()
    worker = start_worker(tmp_path, "--metrics-port", str(port))
    try:
        deadline, got = time.monotonic() + 30, parse("")
        while total(got, "owner_task_total_duration_count") < 1:
            assert worker.poll() is None, worker.communicate()[1]
            assert time.monotonic() < deadline, "the job never showed up in /metrics"
            time.sleep(0.1)  # real: the worker is a subprocess serving real HTTP
            try:
                got = parse(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
            except httpx.TransportError:
                continue  # not listening yet
        assert total(got, "owner_stage_duration_count", stage="call_ai") == 1
    finally:
        code, err = stop(worker)
    assert code == 0, err
