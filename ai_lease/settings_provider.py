"""The ``[provider]`` and ``[providers.<name>]`` sections of the settings.

``[provider]`` names the provider jobs use by default, with its model, base URL and key;
``[providers.<name>]`` holds another provider's own base URL and key, so one settings file
can serve jobs that name different providers without any key going to the wrong one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer, field_validator

from ai_lease.job import MAX_TEMPERATURE, MAX_TOKENS
from ai_lease.providers.headers import check_headers, masked_headers, secret_values
from ai_lease.providers.keys import check_api_key
from ai_lease.redaction import mask_url, register_secret

__all__ = ["EndpointSettings", "ProviderSettings"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _checked_key(key: SecretStr | None) -> SecretStr | None:
    if key is not None:
        check_api_key(key.get_secret_value())  # raises ValueError, never echoing it
    return key


def _masked_url(url: str | None) -> str | None:
    return None if url is None else mask_url(url)


def _checked_headers(headers: Any) -> dict[str, str]:
    """Bounded, valid headers (:func:`~ai_lease.providers.headers.check_headers`), from a
    TOML table or a JSON object (an environment variable); a credential's value is masked
    in every text from then on."""
    if isinstance(headers, str):
        try:
            headers = orjson.loads(headers)
        except orjson.JSONDecodeError:
            raise ValueError('must be a JSON object such as {"X-Team": "search"}') from None
    out = check_headers(headers)
    for value in secret_values(out):
        register_secret(value)
    return out


def _masked_repr_args(self: BaseModel) -> Iterable[tuple[str | None, Any]]:
    for name, value in BaseModel.__repr_args__(self):
        if name == "headers" and value:
            value = masked_headers(value)
        yield name, mask_url(value) if name == "base_url" and value else value


class EndpointSettings(_Section):
    """Where one provider is reached, and with which key (both optional)."""

    base_url: str | None = None
    api_key: SecretStr | None = None
    # Extra request headers for this provider (see ProviderSettings.headers).
    headers: dict[str, str] = Field(default_factory=dict)

    _plain_key = field_validator("api_key")(_checked_key)
    _valid_headers = field_validator("headers", mode="before")(_checked_headers)
    _masked_base_url = field_serializer("base_url")(_masked_url)
    _masked_headers = field_serializer("headers")(masked_headers)
    __repr_args__ = _masked_repr_args


class ProviderSettings(_Section):
    """Which model provider to call, and how."""

    name: str = Field(default="local-extractive", min_length=1)
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    temperature: Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)] | None = (
        None
    )
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    # The lean adapters (openai-compatible, openai-responses, anthropic, gemini, ollama):
    # how streams travel: "aiohttp", "httpx", or "auto" (aiohttp,
    # httpx when a caller passes its own httpx client).
    http: Literal["auto", "aiohttp", "httpx"] = "auto"
    # openai-responses only: run each response in the background (stored by OpenAI), with
    # its id and position checkpointed in the job record, so a new owner resumes the stream
    # instead of paying for the answer twice.
    background: bool = False
    # Hosts ("host" or "host:port") a job file's [provider] base_url may name and still be
    # sent the configured (or ambient OPENAI_API_KEY) key; any other host is refused.
    allowed_hosts: tuple[str, ...] = ()
    # Extra request headers sent with every request of this provider, over the adapter's
    # own; a header set to "" is not sent (e.g. "X-Client-Request-Id" = ""). At most 64.
    headers: dict[str, str] = Field(default_factory=dict)
    # At most this many model calls at once per (provider, base_url) in one process;
    # None: no limit of ai_lease's own.
    max_concurrency: Annotated[int, Field(ge=1, le=10000)] | None = None

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_list(cls, hosts: Any) -> Any:
        """``"a:8080, b"`` (an environment variable) or a TOML list."""
        if isinstance(hosts, str):
            return tuple(h.strip() for h in hosts.split(",") if h.strip())
        return hosts

    _plain_key = field_validator("api_key")(_checked_key)
    _valid_headers = field_validator("headers", mode="before")(_checked_headers)
    _masked_base_url = field_serializer("base_url")(_masked_url)
    _masked_headers = field_serializer("headers")(masked_headers)
    __repr_args__ = _masked_repr_args
