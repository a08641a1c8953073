"""ai_lease through LiteLLM's real proxy in front of llama-cpp-python's server, in every wire
format the proxy serves for that model: OpenAI chat (aiohttp, httpx, the SDK), Anthropic
Messages and the Responses API. The answer is the upstream server's own answer to the same
greedy request; max_tokens reaches it through the translation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ai_lease
from ai_lease.retry import RetryPolicy
from ai_lease.run.config import RunConfig
from ai_lease.timeouts import StreamTimeouts
from tests.realservers.conftest import N_CTX
from tests.realservers.direct import ask, chat_body, run_job
from tests.realservers.servers import MODEL, LiteLLMProxy, LlamaServer

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(300)]

REQUESTS = '"POST /v1/chat/completions HTTP/1.1"'  # one access-log line per request

PROMPT = "Tell me about the lighthouse"
ONCE = RetryPolicy(attempts=1)
# ai_lease's adapters for the proxy's other wire formats: (name, options, base URL suffix).
OTHER_FORMATS: dict[str, tuple[str, dict[str, Any], str]] = {
    "anthropic": ("anthropic", {"api_key": "sk-none"}, ""),
    "responses": ("openai-responses", {"api_key": "sk-none"}, "/v1"),
}


def _job(key: str, **fields: Any) -> ai_lease.Job:
    fields = {"temperature": 0.0, "max_tokens": 12, **fields}
    return ai_lease.Job(key, input=PROMPT, prompt_text="{{ input }}", **fields)


def _greedy(llama: LlamaServer, max_tokens: int = 12) -> str:
    body = chat_body(PROMPT, temperature=0.0, max_tokens=max_tokens)
    text: str = ask(f"{llama.base_url}/chat/completions", body)["choices"][0]["message"]["content"]
    return text.strip()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_openai_chat_through_the_proxy(
    llama: LlamaServer,
    litellm: LiteLLMProxy,
    openai_path: tuple[str, dict[str, Any]],
    tmp_path: Path,
    stream: bool,
) -> None:
    """OpenAI chat through LiteLLM: the upstream server's greedy answer, a `length` finish."""
    expected = _greedy(llama)
    job = _job("chat", stream=stream)
    record = await run_job(tmp_path / "s.db", f"{litellm.base_url}/v1", openai_path, job)
    assert record.output == expected
    assert record.finish_reason == "length"


@pytest.mark.parametrize(
    ("wire", "stream"),
    [("anthropic", True), ("anthropic", False), ("responses", True)],
    ids=["anthropic-stream", "anthropic-whole", "responses-stream"],
)
async def test_other_wire_formats(
    llama: LlamaServer, litellm: LiteLLMProxy, tmp_path: Path, wire: str, stream: bool
) -> None:
    """Anthropic Messages and Responses through LiteLLM: the upstream's greedy answer, and
    max_tokens reaches it (a `length` finish after exactly those tokens)."""
    name, options, suffix = OTHER_FORMATS[wire]
    path = (name, {"model": MODEL, **options})
    expected = _greedy(llama, max_tokens=5)
    job = _job(wire, max_tokens=5, stream=stream)
    record = await run_job(tmp_path / "s.db", f"{litellm.base_url}{suffix}", path, job)
    assert record.output == expected
    # LiteLLM's Responses bridge ends a capped stream `response.completed`, not
    # `response.incomplete`: the length finish is lost on the wire (docs/providers.md).
    assert record.finish_reason == ("stop" if wire == "responses" else "length")


async def test_responses_whole_capped_answer_fails_clearly(
    litellm: LiteLLMProxy, tmp_path: Path
) -> None:
    """A whole (not streamed) Responses answer capped by max tokens comes from LiteLLM's
    bridge as `status: incomplete` with no `incomplete_details`: the job fails naming it,
    it never commits a truncated answer as whole."""
    name, options, suffix = OTHER_FORMATS["responses"]
    path = (name, {"model": MODEL, **options})
    job = _job("responses-whole", max_tokens=5, stream=False)
    with pytest.raises(ai_lease.JobFailed) as failed:
        await run_job(tmp_path / "s.db", f"{litellm.base_url}{suffix}", path, job)
    assert "incomplete" in str(failed.value), failed.value


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_prompt_beyond_the_context_through_the_proxy(
    llama: LlamaServer,
    litellm: LiteLLMProxy,
    openai_path: tuple[str, dict[str, Any]],
    tmp_path: Path,
    stream: bool,
) -> None:
    """A prompt beyond the upstream's context fails the job once, naming the context —
    streamed too, where the proxy turns llama.cpp's empty stream into an empty answer
    that ends `stop` (never a DONE job with an empty result)."""
    mark = llama.log_mark()
    job = ai_lease.Job(
        "long", input="a" * (N_CTX + 100), prompt_text="{{ input }}", max_tokens=4, stream=stream
    )
    with pytest.raises(ai_lease.JobFailed) as failed:
        await run_job(tmp_path / "s.db", f"{litellm.base_url}/v1", openai_path, job)
    assert "context" in str(failed.value).lower(), failed.value
    calls = llama.text()[mark:].count(REQUESTS)
    assert calls == 1, f"{calls} upstream requests for one prompt beyond the context"


async def test_total_timeout_reaches_the_upstream(
    llama: LlamaServer,
    litellm: LiteLLMProxy,
    openai_path: tuple[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    """A stream ai_lease cuts at its total budget is cut upstream too: the proxy closes its
    own stream to llama.cpp, which logs the disconnect."""
    job = _job("slow", max_tokens=N_CTX - 100)
    mark = llama.log_mark()
    with pytest.raises(ai_lease.JobFailed):
        await run_job(
            tmp_path / "s.db",
            f"{litellm.base_url}/v1",
            openai_path,
            job,
            config=RunConfig(
                stream_timeouts=StreamTimeouts(total=0.5), retry=ONCE, call_retry=ONCE
            ),
        )
    llama.wait_log(r"Disconnected from client", since=mark, timeout=20)
