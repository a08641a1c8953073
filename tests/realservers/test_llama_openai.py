"""ai_lease against llama-cpp-python's real server, on each OpenAI path (aiohttp, httpx, the
SDK): the answer is the one the server gives the same request made directly, and what a job
asks for (max_tokens, temperature, tools, a JSON answer) reaches the server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ai_lease
from tests.realservers.conftest import N_CTX
from tests.realservers.direct import ask, ask_stream, chat_body, run_job, stream_text
from tests.realservers.servers import LlamaServer

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(300)]

REQUESTS = '"POST /v1/chat/completions HTTP/1.1"'  # one access-log line per request

PROMPT = "Tell me about the lighthouse"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
            "required": ["city"],
        },
    },
}
FORCED = {"type": "function", "function": {"name": "get_weather"}}


def _job(key: str, **fields: Any) -> ai_lease.Job:
    fields = {"temperature": 0.0, "max_tokens": 12, **fields}
    return ai_lease.Job(key, input=PROMPT, prompt_text="{{ input }}", **fields)


def _url(llama: LlamaServer) -> str:
    return f"{llama.base_url}/chat/completions"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_exact_text(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path, stream: bool
) -> None:
    """The text ai_lease commits is the server's own answer to the same request (greedy)."""
    direct = ask(_url(llama), chat_body(PROMPT, temperature=0.0, max_tokens=12))
    expected = direct["choices"][0]["message"]["content"]
    record = await run_job(tmp_path / "s.db", llama.base_url, openai_path, _job("t", stream=stream))
    assert expected.strip(), "the tiny model answered nothing: the fixture is broken"
    assert record.output == expected  # exactly, whitespace included
    assert record.finish_reason == "length"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_max_tokens_reaches_the_server(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path, stream: bool
) -> None:
    """max_tokens=3 gives the server's 3-token answer and a `length` finish."""
    direct = ask(_url(llama), chat_body(PROMPT, temperature=0.0, max_tokens=3))
    assert direct["usage"]["completion_tokens"] == 3
    job = _job("m", max_tokens=3, stream=stream)
    record = await run_job(tmp_path / "s.db", llama.base_url, openai_path, job)
    assert record.output == direct["choices"][0]["message"]["content"]
    assert record.finish_reason == "length"
    assert record.completion_tokens is None or record.completion_tokens <= 3


async def test_temperature_reaches_the_server(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """At temperature 1.5 the answer is sampled (not the greedy one); at 0 it is greedy."""
    greedy = ask(_url(llama), chat_body(PROMPT, temperature=0.0, max_tokens=16))
    greedy_text = greedy["choices"][0]["message"]["content"].strip()
    store = tmp_path / "s.db"
    cold = await run_job(store, llama.base_url, openai_path, _job("cold", max_tokens=16))
    hot = await run_job(
        store, llama.base_url, openai_path, _job("hot", max_tokens=16, temperature=1.5)
    )
    assert cold.output == greedy_text
    assert hot.output != greedy_text


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_prompt_beyond_the_context_fails_once(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path, stream: bool
) -> None:
    """A prompt longer than the server's context fails the job after one request, saying
    so (whole: the server's 400; streamed: its 200 with no events)."""
    mark = llama.log_mark()
    job = ai_lease.Job(
        "long", input="a" * (N_CTX + 100), prompt_text="{{ input }}", max_tokens=4, stream=stream
    )
    with pytest.raises(ai_lease.JobFailed) as failed:
        await run_job(tmp_path / "s.db", llama.base_url, openai_path, job)
    message = str(failed.value)
    assert "context" in message, message
    calls = llama.text()[mark:].count(REQUESTS)
    assert calls == 1, f"{calls} requests for one prompt beyond the context:\n{llama.tail()}"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_forced_tool_call(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path, stream: bool
) -> None:
    """A forced tool reaches the server: the committed result is its tool call, with the
    arguments the server's grammar produced for the same request."""
    direct = ask(
        _url(llama),
        chat_body(PROMPT, temperature=0.0, max_tokens=40, tools=[WEATHER], tool_choice=FORCED),
    )
    (call,) = direct["choices"][0]["message"]["tool_calls"]
    job = _job(
        "tool", max_tokens=40, tools=[WEATHER], tool_choice=FORCED, output="json", stream=stream
    )
    record = await run_job(tmp_path / "s.db", llama.base_url, openai_path, job)
    (got,) = record.output["tool_calls"]
    assert got["function"]["name"] == "get_weather"
    assert json.loads(got["function"]["arguments"]) == json.loads(call["function"]["arguments"])
    assert json.loads(got["function"]["arguments"])["city"] in ("Oslo", "Rome")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_json_object(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path, stream: bool
) -> None:
    """`response_format: json_object` reaches the server: the answer is the JSON its grammar
    produced for the same request, not the free text the model writes without it."""
    fields = {"temperature": 0.0, "max_tokens": 60, "response_format": {"type": "json_object"}}
    direct = ask(_url(llama), chat_body(PROMPT, **fields))
    text = direct["choices"][0]["message"]["content"]
    job = _job("json", output="json", stream=stream, **fields)
    record = await run_job(tmp_path / "s.db", llama.base_url, openai_path, job)
    assert record.output == json.loads(text)


def test_stream_and_whole_answers_agree(llama: LlamaServer) -> None:
    """The server's streamed and whole answers to one greedy request are the same text (the
    premise of comparing ai_lease's streamed result with a whole direct answer)."""
    body = chat_body(PROMPT, temperature=0.0, max_tokens=12)
    whole = ask(_url(llama), body)["choices"][0]["message"]["content"]
    assert stream_text(ask_stream(_url(llama), body)) == whole


async def test_json_schema_the_server_refuses_is_not_retried(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """llama-cpp-python answers `json_schema` with a 500 whose body says the request is
    invalid: the job fails after at most one more try of that call (never 3 attempts × 3
    calls)."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    mark = llama.log_mark()
    job = _job("schema", output="json", response_format=response_format)
    with pytest.raises(ai_lease.JobFailed) as failed:
        await run_job(tmp_path / "s.db", llama.base_url, openai_path, job)
    assert "500" in str(failed.value), failed.value
    calls = llama.text()[mark:].count(REQUESTS)
    assert calls <= 2, f"{calls} requests for one json_schema the server refuses"
