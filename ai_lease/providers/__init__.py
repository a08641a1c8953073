"""Providers: the protocol, the built-ins, and a registry that also finds third-party ones.

Built-ins: ``local-extractive`` (offline, deterministic — not a model), ``openai`` (the
official SDK), ``openai-compatible`` (the lean httpx client). A package adds its own by
declaring a factory under the entry-point group ``ai_lease.providers``::

    [project.entry-points."ai_lease.providers"]
    my-model = "my_package:make_provider"      # make_provider(**options) -> Provider

Options handed to a factory (only those set): ``model``, ``base_url``, ``api_key``
(a ``SecretStr``), ``connect_timeout``, ``read_timeout``; the CLI gives the two built-in
OpenAI adapters also ``temperature``, ``max_tokens`` (defaults for requests that set none)
and ``max_event_bytes``. A Python caller can always pass a provider object directly instead.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from pydantic import SecretStr

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider, Usage
from ai_lease.redaction import register_secret

__all__ = [
    "ENTRY_POINT_GROUP",
    "ChatRequest",
    "Completion",
    "Delta",
    "Provider",
    "Usage",
    "available_providers",
    "create_provider",
]

ENTRY_POINT_GROUP = "ai_lease.providers"

Factory = Callable[..., Provider]


def _local(**options: Any) -> Provider:
    from ai_lease.providers.local import LocalExtractiveProvider

    return LocalExtractiveProvider()


def _openai(**options: Any) -> Provider:
    from ai_lease.providers.openai_sdk import OpenAISDKProvider

    return OpenAISDKProvider(**options)


def _compat(**options: Any) -> Provider:
    from ai_lease.providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(**options)


BUILTINS: dict[str, Factory] = {
    "local-extractive": _local,
    "openai": _openai,
    "openai-compatible": _compat,
}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_providers() -> list[str]:
    """Every provider name that :func:`create_provider` accepts."""
    return sorted({*BUILTINS, *_plugins()})


def create_provider(name: str, **options: Any) -> Provider:
    """Build provider ``name`` with ``options`` (those left as None are not passed)."""
    given = {k: v for k, v in options.items() if v is not None}
    key = given.get("api_key")
    register_secret(key.get_secret_value() if isinstance(key, SecretStr) else key)
    factory = BUILTINS.get(name)
    if factory is None:
        plugin = _plugins().get(name)
        if plugin is None:
            raise ConfigError(
                f"provider.name: unknown provider {name!r} "
                f"(known: {', '.join(available_providers())})"
            )
        factory = plugin.load()
    return factory(**given)
