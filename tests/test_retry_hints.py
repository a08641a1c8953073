"""Every provider's retry hint reaches the call's retry wait (issue 25 item 6), and a
malformed JSON answer is the same typed, retryable error on every OpenAI path (item 7).

Real HTTP over loopback (:class:`SSEServer`, which answers any path): each adapter is handed
a 429 carrying its provider's documented hint — ``Retry-After`` in seconds or as an HTTP
date, ``retry-after-ms``, Google's ``RetryInfo.retryDelay`` in the body, OpenAI's
``x-ratelimit-reset-*`` — and the waits are read from an injected ``sleep``, never timed.
"""

from __future__ import annotations

import email.utils
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ai_lease.errors import ProviderError
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import ChatRequest, Provider
from ai_lease.providers.errors import MAX_RETRY_AFTER_S, retry_hint
from ai_lease.providers.gemini import GeminiProvider
from ai_lease.providers.ollama import OllamaProvider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.retry import RetryPolicy, call_with_retries
from tests.harness.gemini_server import gemini_sse, gemini_stream
from tests.harness.sse_server import SSEServer, json_response, raw

REQUEST = ChatRequest([{"role": "user", "content": "hi"}], model="m")
QUICK = RetryPolicy(attempts=3, initial=0.01, max_backoff=0.02)
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def google_429(delay: str) -> dict[str, Any]:
    """Google's RESOURCE_EXHAUSTED answer, its hint in the body's RetryInfo."""
    return {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                {"@type": RETRY_INFO, "retryDelay": delay},
            ],
        }
    }


ADAPTERS: dict[str, Callable[[str], Provider]] = {
    "openai-compatible/aiohttp": lambda url: OpenAICompatProvider(
        base_url=url, model="m", http="aiohttp"
    ),
    "openai-compatible/httpx": lambda url: OpenAICompatProvider(
        base_url=url, model="m", http="httpx"
    ),
    "openai-sdk": lambda url: OpenAISDKProvider(base_url=url, api_key="sk-test", model="m"),
    "openai-responses": lambda url: OpenAIResponsesProvider(base_url=url, model="m"),
    "anthropic": lambda url: AnthropicProvider(
        base_url=url.removesuffix("/v1"), api_key="k", model="m"
    ),
    "gemini": lambda url: GeminiProvider(base_url=url, api_key="AIza-test", model="m"),
    "ollama": lambda url: OllamaProvider(base_url=url.removesuffix("/v1"), model="m"),
}
HINTS: dict[str, tuple[dict[str, str], Any, float]] = {  # headers, body, seconds asked
    "retry-after seconds": ({"Retry-After": "4"}, {"error": {"message": "slow"}}, 4.0),
    "retry-after-ms": ({"retry-after-ms": "2500"}, {"error": {"message": "slow"}}, 2.5),
    "google retryDelay": ({}, google_429("4s"), 4.0),
    "openai x-ratelimit-reset": (
        {
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "3.5s",
            "x-ratelimit-remaining-tokens": "900",
            "x-ratelimit-reset-tokens": "120ms",
        },
        {"error": {"message": "Rate limit reached for requests", "type": "requests"}},
        3.5,
    ),
}


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


async def _drain(provider: Provider) -> None:
    async for _ in provider.stream(REQUEST):
        pass


@pytest.mark.parametrize("hint", list(HINTS))
@pytest.mark.parametrize("adapter", list(ADAPTERS))
async def test_every_adapter_carries_every_hint(server: SSEServer, adapter: str, hint: str) -> None:
    """A 429's hint, in whichever documented form, is the error's retry_after on every
    adapter (the SDK's included), streamed or not."""
    headers, body, seconds = HINTS[hint]
    server.enqueue(json_response(429, body, headers), json_response(429, body, headers))
    provider = ADAPTERS[adapter](server.base_url)
    try:
        with pytest.raises(ProviderError) as streamed:
            await _drain(provider)
        with pytest.raises(ProviderError) as whole:
            await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    for caught in (streamed.value, whole.value):
        assert caught.retryable and caught.status == 429, caught
        assert caught.retry_after == pytest.approx(seconds), (hint, caught)


async def test_gemini_retry_delay_is_waited_for(server: SSEServer) -> None:
    """The measured trap: two 429s asking for 4 s each (in the body) are retried after
    waits of at least 4 s each, not after the 0.5 s / 1 s backoff."""
    server.enqueue(
        json_response(429, google_429("4s")),
        json_response(429, google_429("4.000s")),
        gemini_sse(*gemini_stream(["Hello"], usage=(2, 1, 0))),
    )
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    provider = GeminiProvider(base_url=server.base_url, api_key="AIza-test", model="m")
    try:
        text = await call_with_retries(
            lambda: _text(provider), deadline_at=time.monotonic() + 60, sleep=sleep
        )
    finally:
        await provider.aclose()
    assert text == "Hello"
    assert len(waits) == 2 and min(waits) >= 4.0, waits


async def test_a_hint_past_the_stage_deadline_is_not_waited_for(server: SSEServer) -> None:
    """A retryDelay that would end past the stage's deadline: no retry, the 429 raised."""
    server.enqueue(json_response(429, google_429("30s")))
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    provider = GeminiProvider(base_url=server.base_url, api_key="AIza-test", model="m")
    try:
        with pytest.raises(ProviderError, match="429"):
            await call_with_retries(
                lambda: _text(provider), QUICK, deadline_at=time.monotonic() + 5, sleep=sleep
            )
    finally:
        await provider.aclose()
    assert waits == [] and len(server.requests) == 1


async def _text(provider: Provider) -> str:
    return "".join([delta.text async for delta in provider.stream(REQUEST)])


@pytest.mark.parametrize(
    ("headers", "data", "seconds"),
    [
        ({"retry-after": "7"}, None, 7.0),
        ({"retry-after-ms": "250", "retry-after": "7"}, None, 0.25),  # the finer one first
        ({"retry-after-ms": "soon", "retry-after": "7"}, None, 7.0),
        ({"retry-after": "soon"}, google_429("1.5s"), 1.5),
        ({}, [google_429("0.860s")], 0.86),  # Gemini's OpenAI endpoint wraps it in a list
        ({}, google_429("4s")["error"], 4.0),  # the SDK hands the error object only
        ({}, google_429("4 s"), None),
        ({}, google_429("9999s"), MAX_RETRY_AFTER_S),
        ({"x-ratelimit-reset-tokens": "1m30s"}, None, MAX_RETRY_AFTER_S),
        ({"x-ratelimit-reset-tokens": "2.5s", "x-ratelimit-reset-requests": "1s"}, None, 2.5),
        ({"x-ratelimit-reset-requests": "20ms"}, None, 0.02),
        ({"x-ratelimit-reset-requests": "later"}, None, None),
        ({"retry-after-ms": "nan"}, None, None),
        ({}, {"error": {"message": "slow"}}, None),
    ],
)
def test_hint_forms(headers: dict[str, str], data: Any, seconds: float | None) -> None:
    """Each documented form is read (in seconds, bounded); an unreadable one is ignored."""
    assert retry_hint(429, headers, data) == (
        pytest.approx(seconds) if seconds is not None else None
    )


def test_http_date_and_rate_limit_reset_scope() -> None:
    """Retry-After as an HTTP date counts from now; x-ratelimit-reset only says something
    on a 429 (every OpenAI answer carries it)."""
    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (retry_hint(503, {"retry-after": date}) or 0) <= 31
    assert retry_hint(503, {"x-ratelimit-reset-requests": "3s"}) is None


# -- item 7: a malformed JSON answer, one behaviour on every OpenAI path ------------------------

OPENAI_PATHS: dict[str, Callable[[str], Provider]] = {
    "aiohttp": functools.partial(OpenAICompatProvider, model="m", http="aiohttp"),
    "httpx": functools.partial(OpenAICompatProvider, model="m", http="httpx"),
    "sdk": functools.partial(OpenAISDKProvider, api_key="sk-test", model="m"),
}
MALFORMED = raw(200, b'{"id": "chatcmpl-1", "choi', "application/json")


def _openai(path: str, url: str) -> Provider:
    return OPENAI_PATHS[path](base_url=url)  # type: ignore[call-arg]


@pytest.mark.parametrize("path", list(OPENAI_PATHS))
async def test_malformed_json_answer_is_one_typed_retryable_error(
    server: SSEServer, path: str
) -> None:
    """A 200 whose JSON body is cut short is a retryable ProviderError naming what came,
    on the lean paths and the SDK's alike (not the SDK's raw JSONDecodeError)."""
    server.enqueue(MALFORMED)
    provider = _openai(path, server.base_url)
    try:
        with pytest.raises(ProviderError) as caught:
            await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    error = caught.value
    assert type(error) is ProviderError and error.retryable and not error.partial
    assert "not a chat completion" in str(error) and "choi" in str(error), error


@pytest.mark.parametrize("path", list(OPENAI_PATHS))
async def test_malformed_json_answer_is_retried(server: SSEServer, path: str) -> None:
    """The malformed answer is called again, and the good second answer is the result."""
    good = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
    server.enqueue(MALFORMED, json_response(200, good))
    provider = _openai(path, server.base_url)
    try:
        completion = await call_with_retries(lambda: provider.complete(REQUEST), QUICK)
    finally:
        await provider.aclose()
    assert completion.text == "ok" and len(server.requests) == 2
