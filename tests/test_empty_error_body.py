"""An error answer with an empty body (issue 24: llama-cpp-python's 400 to a non-UUID
X-Request-Id) says what was sent that a server may refuse, never "(empty body)" alone:
the status, the request's header names (never a value) and its body's size."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import ChatRequest, Provider
from ai_lease.providers.gemini import GeminiProvider
from ai_lease.providers.ollama import OllamaProvider
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from tests.harness.ollama_server import ollama_url
from tests.harness.sse_server import SSEServer, raw

KEY = "sk-hush-0123456789"


def _root(server: SSEServer) -> str:
    """The server's root (its ``base_url`` ends in ``/v1``)."""
    return server.base_url.removesuffix("/v1")


REQUEST = ChatRequest(
    [{"role": "user", "content": "hi"}], request_id="not-a-uuid", client_request_id="k:1:1"
)
PATHS: dict[str, Callable[[SSEServer], Provider]] = {
    "aiohttp": lambda s: OpenAICompatProvider(base_url=s.base_url, api_key=KEY, model="m"),
    "httpx": lambda s: OpenAICompatProvider(
        base_url=s.base_url, api_key=KEY, model="m", http="httpx"
    ),
    "sdk": lambda s: OpenAISDKProvider(base_url=s.base_url, api_key=KEY, model="m"),
    "ollama": lambda s: OllamaProvider(base_url=ollama_url(s), api_key=KEY, model="m"),
    "anthropic": lambda s: AnthropicProvider(base_url=_root(s), api_key=KEY, model="m"),
    "gemini": lambda s: GeminiProvider(base_url=_root(s) + "/v1beta", api_key=KEY, model="m"),
    "openai-responses": lambda s: OpenAIResponsesProvider(
        base_url=s.base_url, api_key=KEY, model="m"
    ),
}
# The header each adapter carries its key in: named in the message, its value never.
KEY_HEADER = {"anthropic": "x-api-key", "gemini": "x-goog-api-key"}
EMPTY_400 = raw(400, b"", "text/plain")


async def _error(provider: Provider, stream: bool) -> ProviderError:
    try:
        with pytest.raises(ProviderError) as caught:
            if stream:
                async for _ in provider.stream(REQUEST):
                    pass
            else:
                await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    return caught.value


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "complete"])
async def test_an_empty_error_body_names_the_headers_and_size_sent(path: str, stream: bool) -> None:
    """HTTP 400 with no body, on every HTTP adapter: the message has the status, 'empty
    body', the header names sent (X-Request-Id, the key's header) and the body's size;
    never the key."""
    async with SSEServer() as server:
        server.enqueue(EMPTY_400)
        error = await _error(PATHS[path](server), stream)
        size = len(server.requests[0].body)
    text = str(error)
    assert error.status == 400 and not error.retryable, text
    assert "HTTP 400: an empty body" in text, text
    key_header = KEY_HEADER.get(path, "authorization")
    assert re.search(r"(?i)\bx-request-id\b", text), text
    assert re.search(rf"(?i)(?<![\w-]){re.escape(key_header)}\b", text), text
    assert f"a {size}-byte body" in text, text
    assert KEY not in text and "not-a-uuid" not in text, text


async def test_a_body_with_a_message_keeps_the_servers_words() -> None:
    """An error answer that says something is reported as the server said it."""
    async with SSEServer() as server:
        server.enqueue(raw(400, b"bad header", "text/plain"))
        error = await _error(PATHS["httpx"](server), True)
    assert str(error).endswith("HTTP 400: bad header"), str(error)


async def test_the_sdk_names_its_key_header_only_when_it_sent_one() -> None:
    """The SDK adds its key's header past the request an error carries: the message names it
    when the server got it, and not when `provider.headers` dropped it (an SDK too old to
    drop it refuses the setting instead)."""
    for headers, sent in (({}, True), ({"Authorization": ""}, False)):
        async with SSEServer() as server:
            server.enqueue(EMPTY_400)
            try:
                provider = OpenAISDKProvider(base_url=server.base_url, api_key=KEY, model="m",
                                             headers=headers)  # fmt: skip
            except ConfigError as refused:
                assert headers and "cannot drop its own Authorization" in str(refused)
                continue
            text = str(await _error(provider, stream=False))
            got = {name.lower() for name in server.requests[0].headers.keys()}
        assert ("authorization" in got) is sent, got
        assert (re.search(r"(?i)\bauthorization\b", text) is not None) is sent, text
        assert KEY not in text
