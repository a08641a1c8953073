"""What a runner's record says about its run: attempts apart from takeovers, what ran."""

from __future__ import annotations

from ai_lease import LeaseStore, LeaseTimings, ProviderError, RetryPolicy, StageBudget
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.observe.logs import fan_out
from ai_lease.observe.metrics import Metrics
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.testing.scripted import Pause, ScriptedProvider

FAST = LeaseTimings(
    ttl=1.0,
    renew_interval=0.2,
    op_timeout=0.15,
    poll_interval=0.05,
    self_fence_margin=0.2,
    stage_budgets={"call_ai": StageBudget(0.5, 10)},
)
QUICK_RETRY = RetryPolicy(attempts=3, initial=0.05, max_backoff=0.1)


class FailsOnce:
    """A 429 on the first call, then the scripted answer."""

    name = "flaky"
    model = "flaky-1"

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 1:
            raise ProviderError("HTTP 429 rate limited", retryable=True, status=429)
        async for delta in ScriptedProvider(["recovered"]).stream(request):
            yield delta

    async def complete(self, request):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


async def test_retry_by_the_same_node_is_an_attempt_not_a_takeover(store: LeaseStore) -> None:
    """A 429 then success on the same node: attempts 2, takeovers 0, no takeover event;
    the DONE record names the attempt and owner the 429 came from."""
    events: list[Event] = []
    metrics = Metrics()
    runner = Runner(
        store,
        provider=FailsOnce(),
        config=RunConfig(
            timings=FAST, retry=QUICK_RETRY, call_retry=RetryPolicy(attempts=1), node_id="api-1"
        ),
        hooks=RunHooks(on_event=fan_out(events.append, metrics)),
    )
    record = await runner.run(Job("k", input="x"))
    assert record.output == "recovered"
    assert (record.attempts, record.takeovers, record.takeover_cause) == (2, 0, None)
    assert not [e for e in events if e.kind == "takeover"]
    assert "429" in (record.last_error or "") and record.last_error_attempt == 1
    assert (record.last_error_owner or "").startswith("api-1#")
    attempts = metrics.registry.get_sample_value("job_attempts_total", {"pipeline": "default"})
    assert attempts == 2
    for cause in ("expired", "released", "stalled", "other"):
        labels = {"pipeline": "default", "cause": cause}
        assert metrics.registry.get_sample_value("owner_takeover_total", labels) == 0


async def test_committed_record_says_what_ran(store: LeaseStore) -> None:
    """Provider, model, token usage, first-token time, stage durations, start and end."""
    provider = ScriptedProvider(["one ", Pause(0.05), "two"])
    record = await Runner(store, provider=provider, config=RunConfig(timings=FAST)).run(
        Job("k", input="x", model="m-small")
    )
    assert (record.provider, record.model) == ("scripted", "m-small")
    assert (record.prompt_tokens, record.completion_tokens) == (1, 2)
    assert record.first_token_s is not None and 0 <= record.first_token_s < 1
    durations = record.durations or {}
    assert {"load", "build_prompt", "call_ai", "parse"} <= durations.keys()
    assert durations["call_ai"] >= 0.04  # real: the runner measures its stages beside a real store
    assert record.started_at is not None and record.finished_at is not None
    assert record.started_at <= record.finished_at
    stored = await store.get("k")
    assert stored is not None and stored.to_dict()["stage_durations"] == durations
    assert stored.renew_interval == FAST.renew_interval
