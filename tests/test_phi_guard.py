"""φ-accrual suspicion in the stream guard: scripted streams, generous bounds.

Where they can, the guard's tests run on virtual time (``on_virtual_time``, the loop's
clock handed to the guard): it waits on the loop's timers only, so pauses take no real
time. The run at the end stays real: its keeper renews on a real store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from ai_lease import Job, LeaseStore, LeaseTimings, Runner
from ai_lease.errors import ConfigError, StreamIdleTimeout
from ai_lease.lease.events import Event
from ai_lease.observe.metrics import Metrics
from ai_lease.providers.base import ChatRequest
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.testing.clock import on_virtual_time
from ai_lease.testing.scripted import Pause, ScriptedProvider, Stall, Step
from ai_lease.timeouts import StageBudget, StreamTimeouts

REQUEST = ChatRequest([{"role": "user", "content": "hi"}])
FIXED_IDLE = 8.0  # the fixed idle budget: φ must decide well before it


def every_50ms(chunks: int) -> list[Step]:
    """A model streaming one chunk every 50 ms."""
    return [s for _ in range(chunks) for s in ("x", Pause(0.05))]


def loop_clock() -> Callable[[], float]:
    """The running loop's clock, handed to every guard here: the virtual one on a
    VirtualLoop, ``time.monotonic`` on any other loop."""
    return asyncio.get_running_loop().time


def guard(policy: str, seen: list[tuple[float, float]]) -> StreamGuard:
    timeouts = StreamTimeouts(first_token=5, idle=FIXED_IDLE, total=60, idle_policy=policy)  # type: ignore[arg-type]
    on_suspected = lambda phi, s: seen.append((phi, s))  # noqa: E731
    return StreamGuard(timeouts, on_suspected=on_suspected, clock=loop_clock())


async def silence_before_timeout(g: StreamGuard, steps: Sequence[Step]) -> float:
    """Collect ``steps`` expecting an idle timeout; the seconds of silence before it."""
    with pytest.raises(StreamIdleTimeout) as info:
        await g.collect(ScriptedProvider(steps).stream(REQUEST))
    assert g.last_content_at is not None
    assert "φ" in str(info.value)
    return loop_clock()() - g.last_content_at


@on_virtual_time
async def test_a_50ms_stream_gone_silent_is_idle_by_phi_long_before_the_fixed_budget() -> None:
    """idle_policy phi: a 50 ms stream that stops is timed out after ~2 s, not 8 s."""
    seen: list[tuple[float, float]] = []
    silence = await silence_before_timeout(guard("phi", seen), [*every_50ms(30), Stall()])
    assert 1.0 < silence < FIXED_IDLE / 2  # expected 0.05 + 5.61 x 0.35 ≈ 2.0 s
    assert len(seen) == 1 and seen[0][0] >= 8


@on_virtual_time
async def test_the_alert_alone_leaves_the_stream_running() -> None:
    """idle_policy fixed: φ crossing is said once, and the stream that resumes completes."""
    seen: list[tuple[float, float]] = []
    g = guard("fixed", seen)
    steps = [*every_50ms(20), Pause(3.0), *every_50ms(20), Pause(3.0), "end"]
    completion = await g.collect(ScriptedProvider(steps).stream(REQUEST))
    assert completion.text.endswith("end")
    assert len(seen) == 1  # the second long pause is not said again
    assert seen[0][0] >= 8 and 1.0 < seen[0][1] < 3.0
    assert g.suspected_phi == seen[0][0]


@on_virtual_time
async def test_regular_long_pauses_between_bursts_are_not_suspected() -> None:
    """Bursts of 5 chunks 20 ms apart with 0.8 s pauses: φ never reaches 8."""
    burst: list[Step] = [s for _ in range(5) for s in ("x", Pause(0.02))]
    steps = [s for _ in range(5) for s in (*burst, Pause(0.8))] + ["end"]
    seen: list[tuple[float, float]] = []
    completion = await guard("phi", seen).collect(ScriptedProvider(steps).stream(REQUEST))
    assert completion.text.endswith("end")
    assert seen == []


@on_virtual_time
async def test_with_few_gaps_only_the_fixed_budget_applies() -> None:
    """Three chunks then silence: too few gaps for φ; the fixed idle budget fires."""
    timeouts = StreamTimeouts(first_token=5, idle=0.5, total=60, idle_policy="phi")
    seen: list[float] = []
    clock = loop_clock()
    g = StreamGuard(timeouts, on_suspected=lambda phi, s: seen.append(phi), clock=clock)
    started = clock()
    with pytest.raises(StreamIdleTimeout) as info:
        await g.collect(ScriptedProvider(["a", "b", "c", Stall()]).stream(REQUEST))
    assert clock() - started < 5
    assert "φ" not in str(info.value) and info.value.budget_s == 0.5
    assert seen == []


def test_stream_timeouts_check_the_policy_and_threshold() -> None:
    """A policy other than fixed/phi, or a threshold out of (0, 1000), is refused by name."""
    with pytest.raises(ConfigError, match="idle_policy"):
        StreamTimeouts(idle_policy="maybe")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="phi_threshold"):
        StreamTimeouts(phi_threshold=0)
    assert "idle_policy='phi'" in repr(StreamTimeouts(idle_policy="phi"))


def test_suspicion_is_counted_by_provider() -> None:
    """A progress_suspected event counts owner_progress_suspicion_total{provider}."""
    metrics = Metrics()
    event = Event("progress_suspected", "job-1", "node-a#1", 3, "call_ai", 0.0, "scripted")
    metrics(event)
    labels = {"pipeline": "default", "provider": "scripted"}
    assert metrics.registry.get_sample_value("owner_progress_suspicion_total", labels) == 1.0


def test_settings_carry_the_policy_and_threshold_to_the_guard() -> None:
    """stream.idle_policy and lease.phi_threshold reach StreamTimeouts; 11 is refused."""
    from ai_lease.settings import load_settings

    env = {"AI_LEASE_STREAM__IDLE_POLICY": "phi", "AI_LEASE_LEASE__PHI_THRESHOLD": "7"}
    timeouts = load_settings(env=env).stream_timeouts()
    assert (timeouts.idle_policy, timeouts.phi_threshold) == ("phi", 7.0)
    with pytest.raises(ConfigError, match="phi_threshold"):
        load_settings(env={"AI_LEASE_LEASE__PHI_THRESHOLD": "11"})


async def test_a_run_says_progress_suspected_once_and_counts_it(store: LeaseStore) -> None:
    """A run whose 50 ms stream pauses 3 s says progress_suspected once, counts it, ends DONE."""
    events: list[Event] = []
    metrics = Metrics()
    timings = LeaseTimings(
        ttl=5.0, renew_interval=0.5, op_timeout=0.4, poll_interval=0.05,
        self_fence_margin=0.5, stage_budgets={"call_ai": StageBudget(10, 30)},
    )  # fmt: skip
    config = RunConfig(
        timings=timings,
        node_id="n1",
        stream_timeouts=StreamTimeouts(first_token=5, idle=FIXED_IDLE, total=30),
    )
    steps = [*every_50ms(20), Pause(3.0), "end"]
    hooks = RunHooks(on_event=lambda e: (events.append(e), metrics(e)))
    runner = Runner(store, provider=ScriptedProvider(steps), config=config, hooks=hooks)
    done = await runner.run(Job("phi-run", input="x"))
    assert done.output is not None and done.output.endswith("end")
    said = [e for e in events if e.kind == "progress_suspected"]
    assert len(said) == 1 and said[0].value is not None and said[0].value >= 8
    assert said[0].attrs is not None and said[0].attrs["provider"] == "scripted"
    labels = {"pipeline": "default", "provider": "scripted"}
    assert metrics.registry.get_sample_value("owner_progress_suspicion_total", labels) == 1.0
