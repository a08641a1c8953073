"""Providers: the protocol, the built-ins, and a registry that also finds third-party ones.

Built-ins (:data:`BUILTINS`, each with the wire format it speaks): ``local-extractive``
(offline, deterministic — not a model), ``openai`` (the official SDK), ``openai-compatible``
(the lean chat-completions client), ``openai-responses``, ``anthropic``, ``gemini`` and
``ollama`` (lean clients of those native APIs). A package adds its own by
declaring a factory under the entry-point group ``ai_lease.providers``::

    [project.entry-points."ai_lease.providers"]
    my-model = "my_package:make_provider"      # make_provider(**options) -> Provider

Options handed to a factory (only those set): ``model``, ``base_url``, ``api_key``
(a ``SecretStr``), ``connect_timeout``, ``read_timeout``, ``headers`` (extra request
headers, ``{name: value}``; a value of ``""`` means "do not send this header": see
:mod:`ai_lease.providers.headers`); the CLI gives the two built-in
OpenAI adapters also ``temperature``, ``max_tokens`` (defaults for requests that set none)
and ``max_event_bytes``. A Python caller can always pass a provider object directly instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, cast

from pydantic import SecretStr

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider, Usage
from ai_lease.redaction import register_secret

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "Builtin",
    "ChatRequest",
    "Completion",
    "Delta",
    "Provider",
    "Usage",
    "available_providers",
    "create_provider",
    "wire_format",
]

ENTRY_POINT_GROUP = "ai_lease.providers"

Factory = Callable[..., Provider]


@dataclass(frozen=True, slots=True)
class Builtin:
    """A built-in adapter: where its class lives, the wire format it speaks, the base URL
    it calls when none is set, and the environment variables its users keep a key (or,
    for Ollama, the server's address) in, first found wins."""

    target: str  # "module:Class", imported only when the provider is made
    wire: str
    base_url: str | None = None
    key_env: tuple[str, ...] = ()
    host_env: tuple[str, ...] = ()

    def __call__(self, **options: Any) -> Provider:
        module, _, attr = self.target.partition(":")
        cls = getattr(import_module(module), attr)
        return cast(Provider, cls(**options))


BUILTINS: dict[str, Builtin] = {
    "local-extractive": Builtin(
        "ai_lease.providers.local:LocalExtractiveProvider", "none (offline, not a model)"
    ),
    "openai": Builtin(
        "ai_lease.providers.openai_sdk:OpenAISDKProvider",
        "OpenAI chat completions (official SDK)",
        "https://api.openai.com/v1",
        ("OPENAI_API_KEY",),
    ),
    "openai-compatible": Builtin(
        "ai_lease.providers.openai_compat:OpenAICompatProvider",
        "OpenAI chat completions (SSE)",
        "https://api.openai.com/v1",
        ("OPENAI_API_KEY",),
    ),
    "openai-responses": Builtin(
        "ai_lease.providers.openai_responses:OpenAIResponsesProvider",
        "OpenAI Responses API (SSE, named events)",
        "https://api.openai.com/v1",
        ("OPENAI_API_KEY",),
    ),
    "anthropic": Builtin(
        "ai_lease.providers.anthropic:AnthropicProvider",
        "Anthropic Messages API (SSE)",
        "https://api.anthropic.com",
        ("ANTHROPIC_API_KEY",),
    ),
    "gemini": Builtin(
        "ai_lease.providers.gemini:GeminiProvider",
        "Gemini streamGenerateContent (SSE)",
        "https://generativelanguage.googleapis.com/v1beta",
        ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    ),
    "ollama": Builtin(
        "ai_lease.providers.ollama:OllamaProvider",
        "Ollama /api/chat (NDJSON)",
        "http://127.0.0.1:11434",
        host_env=("OLLAMA_HOST",),
    ),
}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def wire_format(name: str) -> str:
    """The wire format provider ``name`` speaks ("plug-in" for a third-party one)."""
    builtin = BUILTINS.get(name)
    return builtin.wire if builtin is not None else "plug-in"


def available_providers() -> list[str]:
    """Every provider name that :func:`create_provider` accepts."""
    return sorted({*BUILTINS, *_plugins()})


def create_provider(name: str, **options: Any) -> Provider:
    """Build provider ``name`` with ``options`` (those left as None are not passed). A
    ``max_concurrency`` option is not the factory's: the provider made is wrapped so that at
    most that many of its calls run at once in this process
    (:func:`~ai_lease.providers.concurrency.limit_calls`)."""
    given = {k: v for k, v in options.items() if v is not None}
    limit = given.pop("max_concurrency", None)
    provider = _made(name, given)
    if limit is None:
        return provider
    from ai_lease.providers.concurrency import limit_calls

    base_url = given.get("base_url") or (BUILTINS[name].base_url if name in BUILTINS else None)
    return limit_calls(provider, limit, base_url=base_url)


def _made(name: str, given: dict[str, Any]) -> Provider:
    key = given.get("api_key")
    register_secret(key.get_secret_value() if isinstance(key, SecretStr) else key)
    factory: Factory | None = BUILTINS.get(name)
    if factory is None:
        plugin = _plugins().get(name)
        if plugin is None:
            raise ConfigError(
                f"provider.name: unknown provider {name!r} "
                f"(known: {', '.join(available_providers())})"
            )
        factory = plugin.load()
    return factory(**given)
