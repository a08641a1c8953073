"""Which base URL and key a provider gets, from the settings, a job file and the environment.

A key belongs to one provider family and the base URL it was configured with; it goes
nowhere else. For the provider a job names (its ``[provider] name``, else
``provider.name``):

- **key**: ``provider.api_key`` when that provider is of the configured one's family (the
  three OpenAI adapters are one family; a key set with ``provider.name`` left at
  ``local-extractive`` is an OpenAI key, as it always was); else
  ``[providers.<name>] api_key``; else the variable its own tools' users keep it in
  (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ``GEMINI_API_KEY`` then ``GOOGLE_API_KEY``).
- **base URL**: the job file's; else the configured one when the key came from it (an
  ambient key goes to the base URL configured for its provider, else the vendor's); else
  ``[providers.<name>] base_url``; else, for Ollama, ``OLLAMA_HOST`` as the ``ollama`` CLI
  reads it; else the adapter's default.
- a job file's base URL on another host than the key was configured for gets no key unless
  ``provider.allowed_hosts`` lists it (:func:`~ai_lease.providers.keys.check_key_destination`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ai_lease.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import SecretStr

    from ai_lease.settings import Settings

__all__ = ["LEAN", "SAMPLED", "provider_options"]

# The lean adapters (HTTPStreamProvider): they take ``http`` and ``max_event_bytes``.
LEAN = frozenset({"openai-compatible", "openai-responses", "anthropic", "gemini", "ollama"})
# Adapters that take the settings' temperature / max_tokens as defaults for their requests.
SAMPLED = LEAN | {"openai"}
_OPENAI_FAMILY = ("OPENAI_API_KEY",)


def provider_options(
    settings: Settings, overrides: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """``(name, options)`` for :func:`~ai_lease.providers.create_provider`."""
    cfg = settings.provider
    env = os.environ if env is None else env
    name = overrides.get("name", cfg.name)
    key, bound = _key(settings, name, env)
    configured = bound if key is not None else _base_url(settings, name, env)
    base_url = overrides.get("base_url")
    if base_url is None:
        base_url = configured
    elif key is not None and base_url != bound:
        from ai_lease.providers.keys import check_key_destination

        check_key_destination(base_url, bound, cfg.allowed_hosts)
    headers = _headers(settings, name, overrides)
    if headers and base_url is not None and base_url != configured:
        _check_headers_go(settings, name, env, headers, base_url, configured)
    options: dict[str, Any] = {
        "model": overrides.get("model", cfg.model),
        "base_url": base_url,
        "api_key": key,
        # a plug-in factory gets headers= only when set; the offline one sends no request
        "headers": headers if headers and name != "local-extractive" else None,
        "max_concurrency": cfg.max_concurrency,  # create_provider's own: never a factory's
    }
    if name in SAMPLED:  # the settings' sampling values are defaults: a job's own win
        options["temperature"] = cfg.temperature
        options["max_tokens"] = cfg.max_tokens
        options["max_event_bytes"] = settings.stream.max_event_bytes
    if name in LEAN:
        options["http"] = cfg.http
    if name == "openai-responses":
        options["background"] = overrides.get("background", cfg.background)
    return name, options


def _headers(settings: Settings, name: str, overrides: Mapping[str, Any]) -> dict[str, str]:
    """Provider ``name``'s extra headers: ``[provider] headers`` (when it is the configured
    provider), then ``[providers.<name>] headers``, then the job file's, later ones winning."""
    from ai_lease.providers.headers import check_headers, merge_headers, secret_values

    cfg, own = settings.provider, settings.providers.get(name)
    layers = [cfg.headers if name == cfg.name else {}, own.headers if own is not None else {}]
    given = overrides.get("headers")
    if given is not None:
        try:
            layers.append(check_headers(given, "job file [provider] headers: "))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        from ai_lease.redaction import register_secret

        for value in secret_values(layers[-1]):
            register_secret(value)  # masked in every text from now on, as a key is
    return merge_headers(*layers)


def _check_headers_go(
    settings: Settings,
    name: str,
    env: Mapping[str, str],
    headers: Mapping[str, str],
    target: str,
    configured: str | None,
) -> None:
    """A job file's base URL on another host than the configured one gets no header that
    carries a credential (by its name, or a value holding a configured key), unless
    ``provider.allowed_hosts`` lists that host."""
    from ai_lease.providers.headers import secret_headers
    from ai_lease.providers.keys import DEFAULT_BASE_URL, check_header_destination

    secret = secret_headers(headers, _known_keys(settings, env))
    if secret:
        trusted = configured or _default_url(name) or DEFAULT_BASE_URL
        check_header_destination(target, trusted, settings.provider.allowed_hosts, secret)


def _known_keys(settings: Settings, env: Mapping[str, str]) -> list[str]:
    """Every API key the settings and the environment hold (to spot one in a header)."""
    from ai_lease.providers import BUILTINS

    keys = [settings.provider.api_key, *(p.api_key for p in settings.providers.values())]
    found = [k.get_secret_value() for k in keys if k is not None]
    variables = {v for builtin in BUILTINS.values() for v in builtin.key_env}
    return found + [value for v in sorted(variables) if (value := env.get(v))]


def _family(name: str) -> tuple[str, ...] | None:
    """The key variables of provider ``name`` (empty: it takes none; None: a plug-in)."""
    from ai_lease.providers import BUILTINS

    builtin = BUILTINS.get(name)
    return None if builtin is None else builtin.key_env


def _default_url(name: str) -> str | None:
    from ai_lease.providers import BUILTINS

    builtin = BUILTINS.get(name)
    return builtin.base_url if builtin is not None else None


def _key(
    settings: Settings, name: str, env: Mapping[str, str]
) -> tuple[SecretStr | None, str | None]:
    """The key provider ``name`` gets and the base URL it is bound to."""
    if name == "local-extractive":
        return None, None
    cfg, own = settings.provider, settings.providers.get(name)
    family, cfg_family = _family(name), _family(cfg.name)
    # provider.api_key serves provider.name and its family (a plug-in is a family of its
    # own): a job naming an installed plug-in never carries another vendor's key, nor the
    # other way round
    same_family = family is not None and cfg_family is not None
    same_family = same_family and family == (cfg_family or _OPENAI_FAMILY)
    if cfg.api_key is not None and (name == cfg.name or same_family):
        return cfg.api_key, cfg.base_url or _default_url(name)
    if own is not None and own.api_key is not None:
        return own.api_key, own.base_url or _default_url(name)
    for variable in _OPENAI_FAMILY if family is None else family:
        if value := env.get(variable):
            # An ambient key goes where the operator pointed this provider (as the vendor's
            # own SDK sends it to its configured base URL), else to the vendor's default.
            mine = cfg.base_url if name == cfg.name else None
            return _ambient(variable, value), mine or (own and own.base_url) or _default_url(name)
    return None, None


def _base_url(settings: Settings, name: str, env: Mapping[str, str]) -> str | None:
    """Where provider ``name`` is reached when no key decides it."""
    from ai_lease.providers import BUILTINS

    cfg, own = settings.provider, settings.providers.get(name)
    if name == cfg.name and cfg.base_url is not None:
        return cfg.base_url
    if own is not None and own.base_url is not None:
        return own.base_url
    builtin = BUILTINS.get(name)
    for variable in builtin.host_env if builtin is not None else ():
        if value := env.get(variable, "").strip():
            return _host_url(name, variable, value)
    return cfg.base_url if name == cfg.name or builtin is None else None


def _host_url(name: str, variable: str, value: str) -> str:
    if name == "ollama":
        from ai_lease.providers.ollama import ollama_base_url

        try:
            return ollama_base_url(value)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"environment {variable}: {exc}") from None
    return value


def _ambient(variable: str, value: str) -> SecretStr:
    """A key from the environment, checked like a configured one (and masked from then on)."""
    from pydantic import SecretStr

    from ai_lease.providers.keys import check_api_key
    from ai_lease.redaction import register_secret

    try:
        check_api_key(value)
    except ValueError as exc:
        raise ConfigError(f"environment {variable}: {exc}") from None
    register_secret(value)
    return SecretStr(value)
