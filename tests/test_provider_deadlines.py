"""Every native adapter's non-streaming call is bounded by the stage's hard deadline.

A real Runner on a real SQLite store runs a ``stream = false`` job against a loopback server
that never answers (or sends its head and then nothing): the job fails at ``call_ai``'s
deadline, promptly, naming it, and the adapter lets go of the connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ai_lease import Job, JobFailed, LeaseTimings, Runner
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import Provider
from ai_lease.providers.gemini import GeminiProvider
from ai_lease.providers.ollama import OllamaProvider
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.run.config import RunConfig
from ai_lease.stores.sqlite.store import SQLiteStore
from ai_lease.timeouts import RetryPolicy, StageBudget
from tests.harness.sse_server import Hang, Response, SSEServer, json_response, sse

DEADLINE_S = 0.6
TIMINGS = LeaseTimings(
    ttl=2.0,
    renew_interval=0.3,
    op_timeout=0.25,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(max_no_progress=30, deadline=DEADLINE_S)},
)
ONCE = RetryPolicy(attempts=1)


def _root(url: str) -> str:
    """The server's root (its ``base_url`` ends in ``/v1``)."""
    return url.removesuffix("/v1")


ADAPTERS: dict[str, Callable[[str], Provider]] = {
    "anthropic": lambda url: AnthropicProvider(base_url=_root(url), api_key="k", model="m"),
    "gemini": lambda url: GeminiProvider(base_url=_root(url) + "/v1beta", api_key="k", model="m"),
    "ollama": lambda url: OllamaProvider(base_url=_root(url), model="m"),
    "openai-responses": lambda url: OpenAIResponsesProvider(base_url=url, api_key="k", model="m"),
}
HANGS: dict[str, Callable[[], Response]] = {
    "no-head": lambda: json_response(200, {}, delay=30.0),
    "head-then-nothing": lambda: sse(Hang()),
}


@pytest.mark.parametrize("hang", sorted(HANGS))
@pytest.mark.parametrize("name", sorted(ADAPTERS))
async def test_a_hung_non_streaming_call_ends_at_the_stage_deadline(
    tmp_path: Path, name: str, hang: str
) -> None:
    """stream = false: a model that never answers fails the job at call_ai's deadline."""
    async with SSEServer() as server, SQLiteStore(tmp_path / "jobs.db") as store:
        server.enqueue(HANGS[hang]())
        provider = ADAPTERS[name](server.base_url)
        config = RunConfig(timings=TIMINGS, retry=ONCE, call_retry=ONCE, node_id="n1")
        runner = Runner(store, provider=provider, config=config)
        started = time.monotonic()
        try:
            with pytest.raises(JobFailed, match="deadline") as caught:
                await runner.run(Job(f"{name}-{hang}", input="x", stream=False))
        finally:
            await provider.aclose()
        elapsed = time.monotonic() - started
        # real: a socket to the loopback test server
        assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + 5, elapsed
        assert "call_ai" in str(caught.value), caught.value
        assert len(server.requests) == 1
        assert server.requests[0].json is not None and not server.requests[0].json.get("stream")
        await server.wait_connections_open(0)
