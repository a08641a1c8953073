"""Adaptive concurrency under ``[limits]`` (issue 29): with ``adaptive = true`` the slots a
process asks for move between ``min_concurrency`` and ``concurrency``: halved when a call is
refused as overloaded (429, 503, 529; once per overload, however many calls were in flight),
one more per round of calls that succeed (AIMD). Against a loopback server that refuses a
third concurrent request with 503, the same jobs draw fewer refusals adaptive than not."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ai_lease import RetryPolicy
from ai_lease.errors import ConfigError, InputError
from ai_lease.job import Job
from ai_lease.lease.call_limits import AdaptiveCap, CallLimit, CallLimits
from ai_lease.lease.events import Event
from ai_lease.observe.metrics import Metrics
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.settings import load_settings
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import StreamTimeouts
from tests.harness.limits import limit_timings
from tests.harness.sse_server import (
    Request,
    Response,
    Sleep,
    SSEServer,
    chat_chunks,
    json_response,
    sse,
)

REAL_TIME = "the loopback server counts the requests in flight in real time"

ANSWER_S, ROOM, JOBS = 0.3, 2, 16
TIMINGS = limit_timings(ttl=5.0, call_ai_hard=120)


def test_overload_halves_once_per_overload_and_success_adds_one_per_round() -> None:
    """8 → 4 on an overload; the other calls in flight then (sent at the old epoch) change
    nothing; down to the floor and no lower; one more per round of successes, up to the
    ceiling and no higher."""
    cap = AdaptiveCap(8, 2)
    sent = cap.epoch
    assert cap.overloaded(sent) and cap.capacity == 4
    assert not cap.overloaded(sent) and cap.capacity == 4, "same overload: halved once"
    assert cap.overloaded(cap.epoch) and cap.capacity == 2
    assert not cap.overloaded(cap.epoch) and cap.capacity == 2, "the floor holds"
    assert [cap.succeeded() for _ in range(2)] == [False, True] and cap.capacity == 3
    for _ in range(100):
        cap.succeeded()
    assert cap.capacity == 8 and cap.current == 8.0


def test_the_settings_take_adaptive_and_its_floor(tmp_path: Path) -> None:
    path = tmp_path / "ai-lease.toml"
    path.write_text(
        '[limits."anthropic"]\nconcurrency = 16\nadaptive = true\nmin_concurrency = 2\n'
    )
    (limit,) = load_settings(path, env={}).run_config().limits.limits
    assert (limit.adaptive, limit.min_concurrency, limit.concurrency) == (True, 2, 16)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("rpm = 60\nadaptive = true\n", "adaptive needs a concurrency"),
        ("concurrency = 2\nadaptive = true\nmin_concurrency = 3\n", "above concurrency 2"),
        ("concurrency = 2\nmin_concurrency = 1\n", "add adaptive"),
        ("concurrency = 2\nadaptive = true\nmin_concurrency = 0\n", "min_concurrency"),
    ],
)
def test_a_bad_adaptive_limit_is_a_config_error(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "ai-lease.toml"
    path.write_text('[limits."anthropic"]\n' + text)
    with pytest.raises(ConfigError, match=said):
        load_settings(path, env={})
    with pytest.raises(InputError):
        CallLimit("anthropic", 2, adaptive=True, min_concurrency=3)


def test_a_change_sets_the_capacity_gauge() -> None:
    metrics = Metrics(pipeline="p")
    metrics(Event("limit_adapted", "j1", value=3.0, attrs={"limit": "anthropic"}))
    labels = {"pipeline": "p", "limit": "anthropic"}
    assert metrics.registry.get_sample_value("provider_slot_capacity", labels) == 3.0


class Crowded:
    """Answers in ``ANSWER_S``; refuses a request with 503 while ``ROOM`` are in flight."""

    def __init__(self) -> None:
        self.answering: list[float] = []
        self.refused = 0

    def __call__(self, request: Request) -> Response:
        now = time.monotonic()
        self.answering = [t for t in self.answering if t > now - ANSWER_S - 0.05]
        if len(self.answering) >= ROOM:
            self.refused += 1
            return json_response(503, {"error": {"message": "overloaded"}})
        self.answering.append(now)
        return sse(Sleep(ANSWER_S), *chat_chunks(["made ", "room"]))


async def _run(tmp_path: Path, name: str, adaptive: bool) -> tuple[int, list[Event]]:
    """Sixteen jobs at once under a limit of six: the server's refusals, and the events."""
    events: list[Event] = []
    store = SQLiteStore(tmp_path / f"{name}.db", poll_interval=0.05)
    crowded = Crowded()
    try:
        async with SSEServer(responder=crowded) as server:
            limit = CallLimit(server.base_url, 6, max_wait=60, adaptive=adaptive)
            config = RunConfig(
                timings=TIMINGS,
                retry=RetryPolicy(attempts=1),
                call_retry=RetryPolicy(attempts=30, initial=0.05, max_backoff=0.5),
                stream_timeouts=StreamTimeouts(first_token=5, idle=5, total=30),
                limits=CallLimits((limit,)),
            )
            provider = OpenAICompatProvider(base_url=server.base_url, model="m")
            runner = Runner(store, provider=provider, config=config, hooks=RunHooks(events.append))
            try:
                jobs = [runner.run(Job(f"{name}-{i}", input="x")) for i in range(JOBS)]
                done = await asyncio.wait_for(asyncio.gather(*jobs), 120)
            finally:
                await provider.aclose()
    finally:
        await store.aclose()
    assert [d.output for d in done] == ["made room"] * JOBS
    return crowded.refused, events


async def test_an_adaptive_limit_draws_fewer_refusals(tmp_path: Path) -> None:
    """The same sixteen jobs against the same server: every job finishes either way; the
    adaptive limit came down to the server's room (saying so) and drew under half the 503s."""
    fixed, _ = await _run(tmp_path, "fixed", adaptive=False)
    adapted, events = await _run(tmp_path, "adaptive", adaptive=True)
    changes = [e for e in events if e.kind == "limit_adapted"]
    assert changes and min(e.value or 99 for e in changes) <= ROOM
    assert changes[0].detail.endswith("at once after a 503")
    assert 2 * adapted < fixed, f"503s: adaptive {adapted}, fixed {fixed}"  # measured 18-21, 81-85
