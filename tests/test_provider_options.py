"""Which key and base URL a provider gets: a key goes only to its own provider family."""

from __future__ import annotations

from typing import Any

import pytest

from ai_lease.cli.provider_options import provider_options
from ai_lease.errors import ConfigError
from ai_lease.settings import load_settings


def options(
    overrides: dict[str, Any], env: dict[str, str], **settings: Any
) -> tuple[str, dict[str, Any]]:
    loaded = load_settings(env={}, **settings)
    return provider_options(loaded, overrides, env=env)


def key_of(opts: dict[str, Any]) -> str | None:
    key = opts["api_key"]
    return None if key is None else key.get_secret_value()


def test_an_openai_key_never_goes_to_anthropic() -> None:
    """A job naming anthropic gets no key from provider.api_key set for OpenAI."""
    cfg = {"provider": {"name": "openai", "api_key": "sk-openai"}}
    name, opts = options({"name": "anthropic"}, {"OPENAI_API_KEY": "sk-env"}, **cfg)
    assert name == "anthropic" and key_of(opts) is None
    _, opts = options({"name": "anthropic"}, {"ANTHROPIC_API_KEY": "sk-ant"}, **cfg)
    assert key_of(opts) == "sk-ant"
    assert opts["base_url"] == "https://api.anthropic.com"


def test_the_providers_section_holds_each_providers_own_key() -> None:
    """[providers.<name>] api_key and base_url are used for that provider only."""
    cfg = {"providers": {"anthropic": {"api_key": "sk-own", "base_url": "http://gw:8080"}}}
    _, opts = options({"name": "anthropic"}, {"ANTHROPIC_API_KEY": "sk-env"}, **cfg)
    assert key_of(opts) == "sk-own" and opts["base_url"] == "http://gw:8080"
    _, opts = options({"name": "gemini"}, {}, **cfg)
    assert key_of(opts) is None


def test_gemini_takes_gemini_key_before_google_key() -> None:
    """GEMINI_API_KEY wins over GOOGLE_API_KEY, as Google's own SDK reads them."""
    env = {"GEMINI_API_KEY": "g-1", "GOOGLE_API_KEY": "g-2"}
    assert key_of(options({"name": "gemini"}, env)[1]) == "g-1"
    assert key_of(options({"name": "gemini"}, {"GOOGLE_API_KEY": "g-2"})[1]) == "g-2"


def test_an_ambient_key_goes_to_no_other_host_from_a_job_file() -> None:
    """A job file's base_url elsewhere gets no ambient key unless allowed_hosts lists it."""
    env = {"ANTHROPIC_API_KEY": "sk-ant"}
    job = {"name": "anthropic", "base_url": "http://evil.example:9000"}
    with pytest.raises(ConfigError, match=r"evil\.example:9000") as caught:
        options(job, env)
    assert "sk-ant" not in str(caught.value)
    _, opts = options(job, env, provider={"allowed_hosts": ["evil.example:9000"]})
    assert key_of(opts) == "sk-ant" and opts["base_url"] == job["base_url"]


def test_a_key_configured_with_the_default_provider_is_still_the_openai_key() -> None:
    """provider.api_key with provider.name left at local-extractive serves OpenAI adapters."""
    cfg = {"provider": {"api_key": "sk-cfg", "base_url": "http://vllm:8000/v1"}}
    _, opts = options({"name": "openai-compatible"}, {}, **cfg)
    assert key_of(opts) == "sk-cfg" and opts["base_url"] == "http://vllm:8000/v1"
    assert key_of(options({"name": "ollama"}, {}, **cfg)[1]) is None


def test_lean_adapters_get_the_stream_settings() -> None:
    """Every lean adapter is handed the HTTP path, sampling defaults and event bound."""
    cfg = {"provider": {"temperature": 0.5, "http": "httpx"}}
    for name in ("anthropic", "gemini", "ollama", "openai-responses", "openai-compatible"):
        opts = options({"name": name}, {}, **cfg)[1]
        assert opts["http"] == "httpx" and opts["temperature"] == 0.5, name
        assert opts["max_event_bytes"] > 0


def test_a_providers_section_key_is_checked_and_never_shown() -> None:
    """A bad key in [providers.x] is refused without echoing it; repr masks a good one."""
    with pytest.raises(ConfigError) as caught:
        load_settings(env={}, providers={"anthropic": {"api_key": "bad key\x00"}})
    assert "bad key" not in str(caught.value)
    settings = load_settings(env={}, providers={"anthropic": {"api_key": "sk-SECRET-1"}})
    assert "sk-SECRET-1" not in repr(settings)


def test_providers_keys_come_from_the_environment() -> None:
    """AI_LEASE_PROVIDERS__ANTHROPIC__API_KEY sets that provider's key."""
    settings = load_settings(env={"AI_LEASE_PROVIDERS__ANTHROPIC__API_KEY": "sk-e"})
    key = settings.providers["anthropic"].api_key
    assert key is not None and key.get_secret_value() == "sk-e"


def test_an_ambient_key_goes_to_the_base_url_the_operator_configured() -> None:
    """OPENAI_API_KEY with provider.base_url set: calls go to that base URL (as the vendor's
    SDK does with its own base URL setting), never silently to api.openai.com; a job file's
    other host still gets no key."""
    env = {"OPENAI_API_KEY": "sk-env"}
    cfg = {"provider": {"name": "openai", "base_url": "http://gateway:4000/v1"}}
    _, opts = options({}, env, **cfg)
    assert opts["base_url"] == "http://gateway:4000/v1" and key_of(opts) == "sk-env"
    own = {"providers": {"anthropic": {"base_url": "http://gw:8080"}}}
    _, opts = options({"name": "anthropic"}, {"ANTHROPIC_API_KEY": "sk-ant"}, **own)
    assert opts["base_url"] == "http://gw:8080" and key_of(opts) == "sk-ant"
    with pytest.raises(ConfigError, match=r"evil\.example"):
        options({"base_url": "http://evil.example/v1"}, env, **cfg)


def test_a_configured_key_never_goes_to_a_plug_in_of_another_name() -> None:
    """provider.api_key set for OpenAI is not handed to a job naming a plug-in provider, and
    a plug-in's configured key is not handed to the OpenAI adapters."""
    cfg = {"provider": {"name": "openai", "api_key": "sk-openai-cfg"}}
    assert key_of(options({"name": "someones-plugin"}, {}, **cfg)[1]) is None
    plug = {"provider": {"name": "someones-plugin", "api_key": "sk-plugin-cfg"}}
    assert key_of(options({}, {}, **plug)[1]) == "sk-plugin-cfg"
    assert key_of(options({"name": "openai-compatible"}, {}, **plug)[1]) is None
