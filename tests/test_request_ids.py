"""The ids a model call carries (issue 24): a fresh UUID4 in X-Request-Id per HTTP request,
the job's correlation in X-Client-Request-Id on the OpenAI paths, both in the job's timeline.

The server here answers as llama-cpp-python's does (0.3.x, its request-id middleware): 400
with an empty body to an X-Request-Id that is not a UUID."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from ai_lease import LeaseStore, LeaseTimings, RetryPolicy, StageBudget
from ai_lease.job import Job
from ai_lease.lease.events import Event
from ai_lease.providers.base import ChatRequest, Provider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.providers.request_ids import CLIENT_ID_MAX, client_id_header
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.stores.sqlite.store import SQLiteStore
from tests.harness.sse_server import Request, Response, SSEServer, chat_chunks, json_response, sse
from tests.test_cli_submit import run_cli

FAST = LeaseTimings(
    ttl=2.0,
    renew_interval=0.6,
    op_timeout=0.5,
    poll_interval=0.05,
    self_fence_margin=0.3,
    stage_budgets={"call_ai": StageBudget(5, 20)},
)
RETRY = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
PATHS: dict[str, Callable[..., Provider]] = {
    "aiohttp": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}


def _uuid4(value: str | None) -> bool:
    try:
        return (
            value is not None and uuid.UUID(value).version == 4 and str(uuid.UUID(value)) == value
        )
    except ValueError:
        return False


class LlamaLike:
    """Answers like llama-cpp-python's server: 400, empty body, to a non-UUID X-Request-Id;
    otherwise the next of ``replies`` (a stream, or one JSON completion)."""

    def __init__(self, *replies: Response) -> None:
        self.replies = list(replies)

    def __call__(self, request: Request) -> Response:
        if not _uuid4(request.headers.get("x-request-id")):
            return Response(400, (("Content-Length", "0"),))
        return self.replies.pop(0)


def _completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


async def _run(
    store: LeaseStore, server: SSEServer, path: str, job: Job, events: list[Event]
) -> Any:
    provider = PATHS[path](base_url=server.base_url, api_key="sk-test", model="m")
    runner = Runner(
        store,
        provider=provider,
        config=RunConfig(timings=FAST, call_retry=RETRY),
        hooks=RunHooks(on_event=events.append),
    )
    try:
        return await asyncio.wait_for(runner.run(job), 30)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
async def test_a_llama_like_server_answers_every_openai_path(
    tmp_path: Path, path: str, stream: bool
) -> None:
    """Each call (the retry too) sends its own UUID4 X-Request-Id and <key>:<token>:<n> in
    X-Client-Request-Id; a server refusing non-UUID ids answers, and the job is DONE; each
    call's ids are in the timeline and the events (the retry said with its wait)."""
    answer = (
        sse(*chat_chunks(["Hel", "lo"])) if stream else json_response(200, _completion("Hello"))
    )
    busy = json_response(503, {"error": {"message": "busy"}})
    events: list[Event] = []
    async with (
        SSEServer(responder=LlamaLike(busy, answer)) as server,
        SQLiteStore(tmp_path / "s.db") as store,
    ):
        done = await _run(store, server, path, Job("trace é", input="x", stream=stream), events)
        entries, _ = await store.timeline("trace é")
    assert done.output == "Hello"
    sent = [r.headers.get("x-request-id") for r in server.requests]
    assert len(sent) == 2 and len(set(sent)) == 2 and all(_uuid4(s) for s in sent), sent
    client = [r.headers.get("x-client-request-id") for r in server.requests]
    assert client == [f"trace%20%C3%A9:{done.token}:1", f"trace%20%C3%A9:{done.token}:2"]
    noted = [e for e in entries if e.kind == "model_call"]
    assert [e.detail.split(" · ")[0] for e in noted] == ["call 1", "call 2"]
    for entry, rid, cid in zip(noted, sent, client, strict=True):
        assert f"request_id {rid}" in entry.detail and f"client_request_id {cid}" in entry.detail
        assert (entry.owner_id, entry.token, entry.stage) == (done.owner_id, done.token, "call_ai")
    [call] = [e for e in events if e.kind == "model_call"]
    assert call.attrs is not None and call.attrs["request_id"] == sent[-1]
    asked = [e.attrs["request_id"] for e in events if e.kind == "model_request" and e.attrs]
    assert asked == sent
    [retry] = [e for e in events if e.kind == "call_retry"]  # said, with its wait
    assert retry.attrs is not None and retry.attrs["calls"] == 1 and "HTTP 503" in retry.detail


def test_events_shows_each_calls_request_id(tmp_path: Path) -> None:
    """``ai-lease events KEY`` (and ``--json``) show every call's X-Request-Id, so a provider
    log line can be found from the job."""
    db = tmp_path / "s.db"

    async def scenario() -> list[str]:
        replies = LlamaLike(
            json_response(500, {"error": {"message": "x"}}), sse(*chat_chunks(["ok"]))
        )
        async with SSEServer(responder=replies) as server, SQLiteStore(db) as store:
            await _run(store, server, "httpx", Job("ev", input="x"), [])
        return [str(r.headers.get("x-request-id")) for r in server.requests]

    sent = asyncio.run(scenario())
    human = run_cli("--store", f"sqlite:///{db}", "events", "ev", cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    lines = [text for text in human.stdout.splitlines() if "  model call  " in text]
    assert len(lines) == 2 and all(rid in text for rid, text in zip(sent, lines, strict=True))
    raw = run_cli("--store", f"sqlite:///{db}", "events", "ev", "--json", cwd=tmp_path)
    entries = [orjson.loads(text) for text in raw.stdout.splitlines()]
    details = [e["detail"] for e in entries if e["kind"] == "model_call"]
    assert [f"request_id {rid}" in d for d, rid in zip(details, sent, strict=True)] == [True, True]


def test_a_callers_odd_client_id_is_made_header_safe_never_refused() -> None:
    """A ChatRequest's client_request_id with CR/LF, non-ASCII or over 512 characters goes
    out percent-encoded and cut (a digest keeps it unique), ASCII and at most 512 long."""
    plain = ChatRequest([], request_id="r", client_request_id="job:1:2")
    assert plain.headers(client_id=True) == {"X-Request-Id": "r", "X-Client-Request-Id": "job:1:2"}
    assert plain.headers() == {"X-Request-Id": "r"}  # the other wire formats: no client id
    odd = ChatRequest([], client_request_id="a\r\nX-Evil: 1")
    assert odd.headers(client_id=True) == {"X-Client-Request-Id": "a%0D%0AX-Evil:%201"}
    long_a, long_b = client_id_header("é" * 600), client_id_header("é" * 599 + "e")
    assert long_a != long_b
    for value in (long_a, long_b):
        assert len(value) <= CLIENT_ID_MAX and value.isascii() and value.isprintable()
