"""Tools, tool choice, response format and image parts: from the job spec, through both
OpenAI-format adapters (loopback SSE server), to the committed result of a real SQLite run.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ai_lease import JobConflict, JobFailed, JobSpecError, LeaseStore, RetryPolicy
from ai_lease.cli.jobfile import load_job_file
from ai_lease.errors import ProviderError
from ai_lease.job import Job, RunFacts
from ai_lease.job_shapes import MAX_IMAGE_BYTES, MAX_IMAGES, MAX_TOOLS, MAX_TOOLS_BYTES
from ai_lease.lease.events import Event
from ai_lease.observe.metrics import Metrics
from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import ChatRequest, Provider, ToolCall
from ai_lease.providers.local import LocalExtractiveProvider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.run.config import RunConfig, RunHooks
from ai_lease.run.runner import Runner
from ai_lease.run.stages import render_request
from ai_lease.testing.contract_support import key_for, own
from tests.harness.sse_server import Cut, SSEServer, completion_json, json_response, sse
from tests.harness.sse_server import Event as Step

REPO = Path(__file__).parent.parent
ADAPTERS: dict[str, Callable[..., Provider]] = {
    "compat": functools.partial(OpenAICompatProvider, http="aiohttp"),
    "compat-httpx": functools.partial(OpenAICompatProvider, http="httpx"),
    "sdk": OpenAISDKProvider,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
}
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
PARTS = [
    {"type": "text", "text": "What is in these?"},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
]
RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"  # a UUID4, as X-Request-Id carries it
REQUEST = ChatRequest(
    [{"role": "user", "content": PARTS}],
    tools=[WEATHER],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    response_format=SCHEMA_FORMAT,
    request_id=RID,
    client_request_id="job-1:3:1",
)
NO_RETRY = RetryPolicy(attempts=1)


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


@pytest.fixture(params=sorted(ADAPTERS))
async def provider(request: pytest.FixtureRequest, server: SSEServer) -> AsyncIterator[Provider]:
    made = ADAPTERS[request.param](base_url=server.base_url, api_key="sk-test", model="m")
    yield made
    await made.aclose()


def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    return {
        "id": "chatcmpl-t",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "choices": [choice],
        **extra,
    }


def usage_chunk(prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
    """The last chunk of an ``include_usage`` stream, with reasoning tokens told apart."""
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    return {**chunk({}), "choices": [], "usage": usage}


def tool_stream(arguments: list[str], name: str = "get_weather") -> list[Step]:
    """A streamed tool call: its head (id, name), then the arguments in pieces."""
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name}}
    events: list[Step] = [chunk({"role": "assistant", "content": None, "tool_calls": [head]})]
    for piece in arguments:
        events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    return [*events, chunk({}, "tool_calls"), usage_chunk(11, 7, 0)]


def tool_completion(arguments: str, reasoning: int = 0) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` whose message only calls a tool."""
    body = completion_json("", (10, 20), finish_reason="tool_calls")
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }
    body["choices"][0]["message"] |= {"content": None, "tool_calls": [call]}
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return body


# -- the adapters ------------------------------------------------------------------------------


async def test_stream_request_carries_tools_choice_format_parts_and_request_id(
    server: SSEServer, provider: Provider
) -> None:
    """A streamed request sends tools, tool choice, response format and content parts as
    given, and X-Request-Id; no Idempotency-Key (OpenAI documents none for chat)."""
    server.enqueue(sse(chunk({"content": "ok"}), chunk({}, "stop")))
    deltas = [d async for d in provider.stream(REQUEST)]
    assert "".join(d.text for d in deltas) == "ok"
    sent = server.requests[0]
    assert sent.json["messages"] == [{"role": "user", "content": PARTS}]
    assert sent.json["tools"] == [WEATHER]
    assert sent.json["tool_choice"] == REQUEST.tool_choice
    assert sent.json["response_format"] == SCHEMA_FORMAT
    assert sent.headers["x-request-id"] == RID
    assert sent.headers["x-client-request-id"] == "job-1:3:1"
    assert "idempotency-key" not in sent.headers


async def test_plain_request_body_has_no_tool_fields(server: SSEServer, provider: Provider) -> None:
    """A request that sets none of them sends none (servers without tools see no change)."""
    server.enqueue(sse(chunk({"content": "ok"}), chunk({}, "stop")))
    _ = [d async for d in provider.stream(ChatRequest([{"role": "user", "content": "hi"}]))]
    body = server.requests[0].json
    assert not {"tools", "tool_choice", "response_format"} & set(body)
    assert "x-request-id" not in server.requests[0].headers


async def test_complete_returns_tool_calls_and_reasoning_tokens(
    server: SSEServer, provider: Provider
) -> None:
    """A non-streamed answer that calls a tool: the calls, finish reason ``tool_calls``, and
    usage with reasoning tokens; the request carried the tools and X-Request-Id."""
    server.enqueue(json_response(200, tool_completion('{"city": "Oslo"}', reasoning=12)))
    completion = await provider.complete(REQUEST)
    assert completion.tool_calls == (ToolCall("call_9", "get_weather", '{"city": "Oslo"}'),)
    assert completion.finish_reason == "tool_calls"
    assert completion.text == ""
    assert completion.usage is not None and completion.usage.reasoning_tokens == 12
    sent = server.requests[0]
    assert sent.json["tools"] == [WEATHER] and "stream" not in sent.json
    assert sent.headers["x-request-id"] == RID
    assert sent.headers["x-client-request-id"] == "job-1:3:1"


async def test_streamed_usage_counts_reasoning_tokens(
    server: SSEServer, provider: Provider
) -> None:
    """``completion_tokens_details.reasoning_tokens`` of a stream's usage is kept apart."""
    server.enqueue(sse(chunk({"content": "ok"}), chunk({}, "stop"), usage_chunk(3, 40, 30)))
    usages = [d.usage async for d in provider.stream(REQUEST) if d.usage is not None]
    assert [(u.prompt_tokens, u.completion_tokens, u.reasoning_tokens) for u in usages] == [
        (3, 40, 30)
    ]


async def test_reasoning_only_then_cut_is_not_partial(
    server: SSEServer, provider: Provider
) -> None:
    """A stream that only thought before it broke delivered no answer text: its error is
    ``partial=False`` (a retry loses nothing visible)."""
    thoughts = [chunk({"content": None, "reasoning_content": f"step {i}. "}) for i in range(3)]
    server.enqueue(sse(chunk({"role": "assistant", "content": ""}), *thoughts, Cut()))
    with pytest.raises(ProviderError) as caught:
        _ = [d async for d in provider.stream(REQUEST)]
    assert caught.value.partial is False


async def test_text_then_cut_is_partial(server: SSEServer, provider: Provider) -> None:
    """The other side of the same rule: visible text before the break is partial."""
    server.enqueue(sse(chunk({"content": "Hal"}), Cut()))
    with pytest.raises(ProviderError) as caught:
        _ = [d async for d in provider.stream(REQUEST)]
    assert caught.value.partial is True


# -- the job spec --------------------------------------------------------------------------------


def _tool(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


BAD_SPECS: list[tuple[dict[str, Any], str]] = [
    ({"tools": [_tool(f"t{i}") for i in range(MAX_TOOLS + 1)]}, r"tools: 129 tools, over"),
    (
        {"tools": [{**WEATHER, "function": {"name": "f", "description": "x" * MAX_TOOLS_BYTES}}]},
        r"tools: \d+ bytes of JSON, over the limit",
    ),
    ({"tools": [_tool("a b")]}, r"tools\[0\]\.function\.name: must be 1 to 64"),
    ({"tools": [_tool("f"), _tool("f")]}, r"tools\[1\]\.function\.name: 'f' is given twice"),
    ({"tools": [{"type": "retrieval"}]}, r"tools\[0\]\.type: must be 'function'"),
    ({"tools": [{**_tool("f"), "extra": 1}]}, r"tools\[0\]: unknown field 'extra'"),
    ({"tools": "get_weather"}, r"tools: must be a list"),
    ({"tool_choice": "auto"}, r"tool_choice: given without tools"),
    ({"tools": [WEATHER], "tool_choice": "always"}, r"tool_choice: must be 'auto'"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        r"tool_choice\.function\.name: 'nope' is not one of the job's tools",
    ),
    ({"response_format": {"type": "xml"}}, r"response_format\.type: must be 'json_object'"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
        r"response_format\.json_schema\.schema: must be a JSON schema object",
    ),
    (
        {"response_format": {"type": "json_object", "pad": "x" * 70_000}},
        r"response_format: unknown field 'pad'",
    ),
    ({"images": ["https://x/a.png"] * (MAX_IMAGES + 1)}, r"images: 17 images, over"),
    ({"images": ["ftp://user:secret@host/a.png"]}, r"images\[0\]: not an http\(s\) URL"),
    ({"images": ["data:image/png;base64,@@@="]}, r"images\[0\]: the data URL is not valid base64"),
    (
        {"images": ["data:image/png;base64," + "A" * (MAX_IMAGE_BYTES * 4 // 3 + 8)]},
        r"images\[0\]: a data URL of about \d+ bytes, over the limit",
    ),
    ({"images": [PNG, "https://x/" + "a" * 9000]}, r"images\[1\]: \d+ characters, over"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_SPECS)
def test_bad_or_oversized_shapes_are_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    """Every size and count from outside is bounded; the error names the field (and never
    echoes a URL that may hold a password)."""
    with pytest.raises(JobSpecError, match=message) as caught:
        Job("k", input="x", **fields)
    assert "secret" not in str(caught.value)
    assert str(caught.value).startswith("job 'k': ")


def test_good_shapes_are_accepted_and_travel_in_the_spec() -> None:
    """A job with all four fields round-trips through its stored spec unchanged."""
    job = Job(
        "k",
        input="x",
        tools=[WEATHER],
        tool_choice="required",
        response_format=SCHEMA_FORMAT,
        images=[PNG, "https://example.com/cat.png"],
    )
    again = Job.from_spec(job.to_spec())
    assert again == job and again.fingerprint() == job.fingerprint()


def test_fingerprint_of_a_job_without_the_new_fields_is_unchanged() -> None:
    """Jobs stored before these fields existed keep their fingerprint (no spurious conflict)."""
    assert Job("k", input="x").fingerprint() == "f8826241ea3a96d03623ae22758c72d5"
    assert "tools" not in Job("k", input="x").payload()


def test_a_changed_tool_list_is_a_different_job() -> None:
    """Tools, tool choice, response format and images are all part of the fingerprint."""
    base = Job("k", input="x", tools=[WEATHER])
    other_tool = {**WEATHER, "function": {**WEATHER["function"], "description": "Rain?"}}
    variants = [
        Job("k", input="x"),
        Job("k", input="x", tools=[other_tool]),
        Job("k", input="x", tools=[WEATHER], tool_choice="required"),
        Job("k", input="x", tools=[WEATHER], response_format={"type": "json_object"}),
        Job("k", input="x", tools=[WEATHER], images=[PNG]),
    ]
    assert len({base.fingerprint(), *(v.fingerprint() for v in variants)}) == 6


def test_render_request_turns_images_into_content_parts() -> None:
    """Images follow the rendered text as image parts; tools and formats ride along; a job
    without images keeps a plain text message."""
    prompts = PromptLibrary()
    job = Job(
        "k",
        input="a cat",
        prompt_text="Describe {{ input }}.",
        images=["https://example.com/cat.png", PNG],
        tools=[WEATHER],
        response_format={"type": "json_object"},
    )
    request = render_request(job, prompts, job.input)
    assert request.messages[-1]["content"] == [
        {"type": "text", "text": "Describe a cat."},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]
    assert request.tools == [WEATHER] and request.response_format == {"type": "json_object"}
    plain = render_request(Job("k", input="a", prompt_text="{{ input }}"), prompts, "a")
    assert plain.messages[-1]["content"] == "a" and plain.tools is None


def test_job_file_reads_the_fields_and_names_a_wrong_type(tmp_path: Path) -> None:
    """A TOML job file gives tools, tool choice, response format and images; a value of the
    wrong type is refused naming the file and the field."""
    path = tmp_path / "job.toml"
    path.write_text(
        'key = "k"\ninput = "x"\nimages = ["https://example.com/a.png"]\n'
        'tool_choice = "auto"\n[response_format]\ntype = "json_object"\n'
        '[[tools]]\ntype = "function"\n[tools.function]\nname = "f"\n'
        '[tools.function.parameters]\ntype = "object"\n'
    )
    job = load_job_file(path).job
    assert job.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert (job.tool_choice, job.images) == ("auto", ["https://example.com/a.png"])
    path.write_text('key = "k"\ninput = "x"\nimages = "https://example.com/a.png"\n')
    with pytest.raises(JobSpecError, match=r"job\.toml.*field 'images' must be list"):
        load_job_file(path)


def test_the_example_tool_call_job_file_is_valid() -> None:
    """examples/tool_call.toml loads and checks (tools, tool choice, output json)."""
    job = load_job_file(REPO / "examples" / "tool_call.toml").job
    assert job.tools and job.output == "json"
    assert job.tool_choice == "auto"


# -- whole jobs on a real SQLite store ------------------------------------------------------------


@pytest.fixture
async def compat(server: SSEServer) -> AsyncIterator[OpenAICompatProvider]:
    made = OpenAICompatProvider(base_url=server.base_url, model="m")
    yield made
    await made.aclose()


def _runner(store: LeaseStore, provider: Provider, **hooks: Any) -> Runner:
    """A runner that tries once: a failed parse fails the job at once."""
    config = RunConfig(retry=NO_RETRY, call_retry=NO_RETRY)
    return Runner(store, provider=provider, config=config, hooks=RunHooks(**hooks))


def _tool_job(key: str = "weather", **fields: Any) -> Job:
    return Job(
        key,
        input="Oslo",
        prompt_text="Weather in {{ input }}?",
        tools=[WEATHER],
        tool_choice="auto",
        output="json",
        **fields,
    )


async def test_a_tool_calling_job_commits_the_assistant_message(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """A streamed tool call is the job's result: the assistant message in OpenAI's shape,
    its arguments the whole JSON text; the request carried the tools and image parts."""
    server.enqueue(sse(*tool_stream(['{"ci', 'ty": "Os', 'lo"}'])))
    record = await _runner(sqlite_store, compat).run(_tool_job(images=[PNG]))
    assert record.output == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            }
        ],
    }
    assert record.finish_reason == "tool_calls"
    sent = server.requests[0].json
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "auto"
    assert sent["messages"][-1]["content"][1] == {"type": "image_url", "image_url": {"url": PNG}}


async def test_malformed_tool_arguments_fail_the_parse_naming_tool_and_offset(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """Arguments that are not JSON fail the json job's parse stage: the error names the
    tool, its call id and the offset where the JSON broke."""
    server.enqueue(sse(*tool_stream(['{"city": ', '"Oslo"'])))
    with pytest.raises(JobFailed, match=r"'get_weather', id 'call_1'.*not JSON at offset 15"):
        await _runner(sqlite_store, compat).run(_tool_job())


async def test_a_text_job_keeps_tool_arguments_unchecked(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """Only a json job checks the arguments; a text job still gets the assistant message."""
    server.enqueue(sse(*tool_stream(["not json"])))
    job = Job("t", input="x", prompt_text="{{ input }}", tools=[WEATHER])
    record = await _runner(sqlite_store, compat).run(job)
    assert record.output["tool_calls"][0]["function"]["arguments"] == "not json"


async def test_json_schema_answers_are_checked_to_be_json(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """With a json_schema response format a JSON answer is the result; a non-JSON answer
    fails the parse (JSON-ness only: no schema validator is a dependency)."""
    job = Job(
        "s", input="x", prompt_text="{{ input }}", output="json", response_format=SCHEMA_FORMAT
    )
    server.enqueue(sse(chunk({"content": '{"ok": true}'}), chunk({}, "stop")))
    assert (await _runner(sqlite_store, compat).run(job)).output == {"ok": True}
    server.enqueue(sse(chunk({"content": "sure! ok"}), chunk({}, "stop")))
    with pytest.raises(JobFailed, match="not JSON"):
        await _runner(sqlite_store, compat).run(
            Job(
                "s2",
                input="x",
                prompt_text="{{ input }}",
                output="json",
                response_format=SCHEMA_FORMAT,
            )
        )


async def test_a_changed_tool_list_under_the_same_key_is_a_conflict(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """Resubmitting a key with other tools is a conflict, never the old tool call."""
    server.enqueue(sse(*tool_stream(['{"city": "Oslo"}'])))
    await _runner(sqlite_store, compat).run(_tool_job())
    other = {**WEATHER, "function": {**WEATHER["function"], "name": "get_rain"}}
    with pytest.raises(JobConflict):
        await _runner(sqlite_store, compat).run(
            Job(
                "weather",
                input="Oslo",
                prompt_text="Weather in {{ input }}?",
                tools=[other],
                tool_choice="auto",
                output="json",
            )
        )


async def test_reasoning_tokens_reach_the_model_call_event_and_tokens_total(
    sqlite_store: LeaseStore, server: SSEServer, compat: Provider
) -> None:
    """Reasoning tokens are kept in the record, ride on ``model_call`` and count in
    ``tokens_total{kind="reasoning"}``; a call with none adds no reasoning sample."""
    events: list[Event] = []
    metrics = Metrics()

    def sink(event: Event) -> None:
        events.append(event)
        metrics(event)

    answer = [chunk({"content": "42"}), chunk({}, "stop"), usage_chunk(5, 50, 45)]
    server.enqueue(sse(*answer))
    record = await _runner(sqlite_store, compat, on_event=sink).run(
        Job("r", input="x", prompt_text="q")
    )
    assert (record.completion_tokens, record.reasoning_tokens) == (50, 45)
    call = next(e for e in events if e.kind == "model_call")
    assert call.attrs is not None
    assert call.attrs["reasoning_tokens"] == 45 and call.attrs["tool_calls"] == 0
    labels = {"pipeline": "default", "provider": "openai-compatible", "model": "m"}
    value = metrics.registry.get_sample_value
    assert value("tokens_total", labels | {"kind": "reasoning"}) == 45
    assert value("tokens_total", labels | {"kind": "completion"}) == 50
    server.enqueue(sse(chunk({"content": "7"}), chunk({}, "stop"), usage_chunk(5, 1, 0)))
    await _runner(sqlite_store, compat, on_event=metrics).run(Job("r0", input="x", prompt_text="q"))
    assert value("tokens_total", labels | {"kind": "reasoning"}) == 45


async def test_the_record_keeps_reasoning_tokens_on_both_stores(store: LeaseStore) -> None:
    """A commit's reasoning tokens are in its answer and in the stored record (SQLite and
    Redis); a commit that gives none leaves them unset."""
    key = key_for("reasoning")
    fence = await own(store, key, "api-1#1.aa")
    facts = RunFacts(provider="p", prompt_tokens=3, completion_tokens=40, reasoning_tokens=30)
    done = await store.commit(fence, '"ok"', facts=facts)
    for job in (done, await store.get(key)):
        assert job is not None
        assert (job.completion_tokens, job.reasoning_tokens) == (40, 30)
    plain = key_for("no-reasoning")
    await store.commit(await own(store, plain, "api-1#1.aa"), '"ok"', facts=RunFacts(provider="p"))
    stored = await store.get(plain)
    assert stored is not None and stored.reasoning_tokens is None


async def test_the_offline_provider_reads_the_text_of_a_job_with_images(
    sqlite_store: LeaseStore,
) -> None:
    """A job with images under local-extractive summarises the text part (no crash on
    content parts; the images are not read)."""
    provider = LocalExtractiveProvider(pace_s=0.0)
    job = Job("img", input="One. Two words here.", prompt_text="{{ input }}", images=[PNG])
    record = await _runner(sqlite_store, provider).run(job)
    assert record.output == "One. Two words here."
