"""Session fixtures of the real-server suite: the tiny model, one llama-cpp-python server and
one LiteLLM proxy in front of it, each started once per session on a free loopback port.

A missing servers' venv fails these tests with what to run; they never skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realservers.servers import (
    MODEL,
    LiteLLMProxy,
    LlamaServer,
    servers_python,
    write_tiny_model,
)

N_CTX = 4096  # the model reads characters: a prompt of N_CTX characters is beyond it

# The three OpenAI paths of ai_lease: (provider name, provider options besides base_url).
OPENAI_PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "aiohttp": ("openai-compatible", {"http": "aiohttp"}),
    "httpx": ("openai-compatible", {"http": "httpx"}),
    "sdk": ("openai", {"api_key": "sk-none"}),
}


@pytest.fixture(scope="session")
def servers_py() -> Path:
    """The servers' Python; missing, it fails the test with what to run (never a skip)."""
    try:
        return servers_python()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def tiny_model(servers_py: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight llama GGUF, written for this session."""
    return write_tiny_model(servers_py, tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama(
    servers_py: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """llama-cpp-python's server with its defaults (one slot, ``interrupt_requests`` on)."""
    log = tmp_path_factory.mktemp("llama") / "llama.log"
    try:
        server = LlamaServer(servers_py, tiny_model, log=log, n_ctx=N_CTX)
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def litellm(
    servers_py: Path, llama: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiteLLMProxy]:
    """LiteLLM's proxy in front of ``llama``, serving model ``tiny``."""
    log = tmp_path_factory.mktemp("litellm") / "litellm.log"
    try:
        proxy = LiteLLMProxy(servers_py, llama.base_url, log=log)
        proxy.start()
    except (RuntimeError, FileNotFoundError) as exc:
        pytest.fail(f"LiteLLM's proxy did not start: {exc}", pytrace=False)
    yield proxy
    proxy.stop()


@pytest.fixture(params=sorted(OPENAI_PATHS))
def openai_path(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """One of ai_lease's OpenAI paths: aiohttp, httpx (both ``openai-compatible``), the SDK."""
    name, options = OPENAI_PATHS[request.param]
    return name, {"model": MODEL, **options}
