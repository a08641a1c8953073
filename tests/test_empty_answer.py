"""An answer with no text and no tool call is never stored as DONE unless the job allows
it: the job fails at once (not retried with the same budget), saying what happened."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import ai_lease.errors as errors
from ai_lease.errors import AiLeaseError, EmptyAnswer, JobFailed, ProviderError
from ai_lease.job import Job, Status
from ai_lease.lease.base import LeaseStore
from ai_lease.providers.base import Delta, ToolCallDelta
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.run.runner import Runner
from ai_lease.stores import open_store
from ai_lease.testing.scripted import ScriptedProvider
from tests.harness.sse_server import SSEServer, sse


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[LeaseStore]:
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield store
    await store.aclose()


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


async def _fails(runner: Runner, job: Job, store: LeaseStore) -> str:
    with pytest.raises(JobFailed):
        await runner.run(job)
    record = await store.get(job.key)
    assert record is not None and record.status is Status.FAILED and record.result is None
    assert record.attempts == 1, "not retried with the same budget"
    return record.last_error or ""


async def test_a_plain_empty_answer_with_a_normal_stop_fails(sqlite: LeaseStore) -> None:
    """A stream that ends `stop` with no text (a gateway's answer to a prompt beyond the
    context) ends FAILED saying the answer was empty; nothing is stored as the result."""
    provider = ScriptedProvider([""])
    why = await _fails(Runner(sqlite, provider=provider), Job("e", input="x."), sqlite)
    assert "empty" in why and "allow_empty" in why, why
    assert provider.calls == 1


async def test_reasoning_that_spends_the_whole_budget_says_raise_max_tokens(
    sqlite: LeaseStore,
) -> None:
    """Only reasoning deltas, then a `length` finish with reasoning tokens counted, over
    real HTTP: FAILED with "spent max_tokens=N on reasoning … raise max_tokens"."""
    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": None, "reasoning_content": "thinking hard. "}),
        chunk({}, "length"),
        chunk(
            {},
            None,
            usage={
                "prompt_tokens": 5,
                "completion_tokens": 16,
                "completion_tokens_details": {"reasoning_tokens": 16},
            },
        ),
    ]
    async with SSEServer(responder=lambda request: sse(*events)) as server:
        provider = OpenAICompatProvider(base_url=server.base_url, api_key="sk-test", model="m")
        try:
            job = Job("r", input="x.", max_tokens=16)
            why = await _fails(Runner(sqlite, provider=provider), job, sqlite)
        finally:
            await provider.aclose()
    assert "spent max_tokens=16 on reasoning" in why and "raise max_tokens" in why, why
    assert len(server.requests) == 1


async def test_a_length_finish_with_no_text_says_raise_max_tokens(sqlite: LeaseStore) -> None:
    """A `length` finish and no text at all: the reason names the cap to raise."""
    provider = ScriptedProvider([Delta(reasoning="hmm")], finish_reason="length")
    why = await _fails(
        Runner(sqlite, provider=provider), Job("l", input="x.", max_tokens=8), sqlite
    )
    assert "max_tokens=8" in why and "raise max_tokens" in why, why


async def test_allow_empty_stores_the_empty_answer(sqlite: LeaseStore) -> None:
    """A job that says allow_empty = true has its empty answer stored DONE."""
    record = await Runner(sqlite, provider=ScriptedProvider([""])).run(
        Job("ok", input="x.", allow_empty=True)
    )
    assert record.status is Status.DONE and record.output == ""


async def test_a_tool_call_with_no_text_is_not_empty(sqlite: LeaseStore) -> None:
    """An answer that only calls a tool is a whole answer, stored DONE."""
    call = Delta(tool_calls=(ToolCallDelta(0, "call_1", "lookup", '{"q": 1}'),))
    provider = ScriptedProvider([call], finish_reason="tool_calls")
    record = await Runner(sqlite, provider=provider).run(Job("t", input="x."))
    assert record.status is Status.DONE
    assert record.output["tool_calls"][0]["function"]["name"] == "lookup"


def test_allow_empty_leaves_old_fingerprints_alone() -> None:
    """allow_empty is in the payload only when set: a job stored before keeps its digest."""
    assert "allow_empty" not in Job("k", input="x").payload()
    assert Job("k", input="x", allow_empty=True).fingerprint() != Job("k", input="x").fingerprint()


def _error_classes() -> list[type[AiLeaseError]]:
    found = [getattr(errors, name) for name in errors.__all__]
    return [c for c in found if isinstance(c, type) and issubclass(c, AiLeaseError)]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_error_in_the_tree_survives_pickling(cls: type[AiLeaseError]) -> None:
    """Process isolation sends errors through a pipe: each one comes back the same type,
    message and fields (ProviderError's keyword-only arguments included)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, "what happened")
    exc.__dict__.update({"retryable": False, "status": 400, "provider": "p"})
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls and str(back) == str(exc) and back.__dict__ == exc.__dict__


def test_a_provider_error_built_as_raised_survives_pickling() -> None:
    """ProviderError("x", retryable=False, status=400), as adapters raise it, unpickles."""
    for exc in (
        ProviderError("bad request", retryable=False, provider="p", status=400),
        EmptyAnswer("the model's answer is empty", provider="p"),
    ):
        back = pickle.loads(pickle.dumps(exc))
        assert (type(back), str(back), back.retryable, back.status) == (
            type(exc),
            str(exc),
            exc.retryable,
            exc.status,
        )
