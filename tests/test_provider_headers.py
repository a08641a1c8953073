"""Extra request headers per provider (issue 24): ``[provider] headers`` reach every HTTP
adapter, ``""`` drops a default header, bad ones are refused, and a header carrying a
credential never goes to a host its settings were not made for."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from ai_lease.cli.provider_options import provider_options
from ai_lease.errors import ConfigError, ProviderError
from ai_lease.providers import create_provider
from ai_lease.providers.base import ChatRequest, Provider
from ai_lease.redaction import redact
from ai_lease.settings import load_settings
from tests.harness.sse_server import SSEServer
from tests.test_cli_submit import run_cli

RID = "9f1c1a57-2b7e-4f0c-8d7e-3c1b2a4d5e6f"
REQUEST = ChatRequest(
    [{"role": "user", "content": "hi"}], model="m", request_id=RID, client_request_id="k:1:1"
)
# provider -> (the base URL it is given, the header its key goes in)
HTTP_PROVIDERS = {
    "openai-compatible": ("/v1", "authorization"),
    "openai-responses": ("/v1", "authorization"),
    "openai": ("/v1", "authorization"),
    "anthropic": ("", "x-api-key"),
    "gemini": ("/v1beta", "x-goog-api-key"),
    "ollama": ("", "authorization"),
}


def _options(overrides: dict[str, Any], env: dict[str, str] | None = None, **cfg: Any) -> Any:
    return provider_options(load_settings(env={}, **cfg), overrides, env=env or {})


async def _sent(provider: Provider, server: SSEServer, *, stream: bool = True) -> dict[str, str]:
    """The headers of one request the provider made (the scripted server answers 500)."""
    try:
        with contextlib.suppress(ProviderError):
            if stream:
                async for _ in provider.stream(REQUEST):
                    pass
            else:
                await provider.complete(REQUEST)
    finally:
        await provider.aclose()
    return server.requests[-1].headers


@pytest.mark.parametrize("name", sorted(HTTP_PROVIDERS))
async def test_settings_headers_reach_every_http_adapter_and_empty_drops(name: str) -> None:
    """Each HTTP adapter sends [provider] headers over its own; "" drops one it would send
    (its key's header, the client id), on the stream path and the one-response path."""
    suffix, key_header = HTTP_PROVIDERS[name]
    headers = {"X-Team": "search", key_header: "", "X-Client-Request-Id": "", "X-Request-Id": ""}
    if name == "openai" and _sdk_too_old_to_drop():
        cfg = {"name": name, "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-test-12345"}
        name_, opts = _options({}, provider={**cfg, "headers": headers})
        with pytest.raises(ConfigError, match=r"cannot drop its own .*openai >= 3\.20"):
            create_provider(name_, **opts)  # refused, never silently sent
        return
    async with SSEServer() as server:
        base = f"http://127.0.0.1:{server.port}{suffix}"
        cfg = {"name": name, "base_url": base, "api_key": "sk-test-12345", "model": "m"}
        for stream in (True, False):
            name_, opts = _options({}, provider={**cfg, "headers": headers})
            sent = await _sent(create_provider(name_, **opts), server, stream=stream)
            assert sent["x-team"] == "search", sent
            assert not {key_header, "x-client-request-id", "x-request-id"} & set(sent), sent
        name_, opts = _options({}, provider=cfg)  # without headers: the defaults all go
        sent = await _sent(create_provider(name_, **opts), server)
    assert key_header in sent and sent["x-request-id"] == RID and "x-team" not in sent
    assert ("x-client-request-id" in sent) == name.startswith("openai")


def test_headers_merge_settings_then_providers_section_then_job_file() -> None:
    """[provider] headers, then [providers.<name>] headers, then the job file's win, names
    ignoring case; a plug-in factory gets headers= only when some are set."""
    cfg: dict[str, Any] = {
        "provider": {"name": "ollama", "headers": {"X-A": "1", "X-B": "1"}},
        "providers": {"ollama": {"headers": {"x-b": "2", "X-C": "2"}}},
    }
    _, opts = _options({"headers": {"X-C": "3", "X-D": ""}}, **cfg)
    assert opts["headers"] == {"X-A": "1", "x-b": "2", "X-C": "3", "X-D": ""}
    _, other = _options({"name": "gemini"}, **cfg)  # [provider] headers are ollama's only
    assert other["headers"] is None
    assert _options({})[1]["headers"] is None
    name, offline = _options({}, provider={"headers": {"X-A": "1"}})  # it sends no request
    assert name == "local-extractive" and offline["headers"] is None
    create_provider(name, **offline)


def test_a_job_files_credential_header_is_masked_from_then_on() -> None:
    """A job file's Authorization value is registered as a secret: redact() masks it."""
    _options({"headers": {"Authorization": "Bearer job-secret-987"}})
    assert "job-secret-987" not in redact("401 for job-secret-987")


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({f"X-{i}": "v" for i in range(65)}, "65 headers; at most 64"),
        ({"X A": "v"}, "not a valid header name"),
        ({"X-A": "a\r\nInjected: 1"}, "U\\+000D"),
        ({"X-A": "\u00e9"}, "U\\+00E9"),
        ({"X-A": "v" * 8193}, "8193 characters"),
        ({"X-A": 1}, "must be a text"),
        ({"X-A": "1", "x-a": "2"}, "given twice"),
    ],
)
def test_bad_headers_are_refused_in_settings_and_job_files(
    headers: dict[str, Any], problem: str
) -> None:
    """Too many, a bad name, a CR/LF or non-ASCII value, one too long, not a text, a name
    twice: refused (ConfigError) from the settings and from a job file."""
    with pytest.raises(ConfigError, match=problem):
        load_settings(env={}, provider={"headers": headers})
    with pytest.raises(ConfigError, match=f"job file \\[provider\\] headers: .*{problem}"):
        _options({"headers": headers})
    with pytest.raises(ConfigError, match=problem):
        create_provider("openai-compatible", base_url="http://127.0.0.1:1/v1", headers=headers)


def test_a_credential_header_never_goes_to_another_host() -> None:
    """Authorization-like headers, or one holding a configured key, go only to the host the
    settings configured (or an allowed one): a job file's base_url elsewhere is refused."""
    cfg = {"name": "openai-compatible", "base_url": "http://gw.local:8080/v1"}
    elsewhere = {"base_url": "http://evil.example:9000/v1"}
    for name in (
        *("Authorization", "proxy-authorization", "X-Api-Key", "api-key", "Cookie"),
        # gateways' own credential headers: known by the words in their names
        *("X-Auth-Token", "Ocp-Apim-Subscription-Key", "x-litellm-api-key", "Helicone-Auth"),
    ):
        secret = {**cfg, "headers": {name: "Bearer team-token-1"}}
        with pytest.raises(ConfigError, match=r"evil\.example:9000") as caught:
            _options(elsewhere, provider=secret)
        assert "team-token-1" not in str(caught.value) and name in str(caught.value)
        with pytest.raises(ConfigError, match="carry a credential"):  # the job's own, too
            _options({**elsewhere, "headers": {name: "x"}}, provider=cfg)
    mine = {"X-Mine": "k=sk-configured-1"}  # anthropic's key, in a header to openai-compatible
    keyed = {"provider": cfg, "providers": {"anthropic": {"api_key": "sk-configured-1"}}}
    with pytest.raises(ConfigError, match="X-Mine"):
        _options({**elsewhere, "headers": mine}, **keyed)
    ambient = {"ANTHROPIC_API_KEY": "sk-configured-1"}  # an ambient key counts too
    with pytest.raises(ConfigError, match="X-Mine"):
        _options({**elsewhere, "headers": mine}, ambient, provider=cfg)
    _, opts = _options({**elsewhere, "headers": {"X-Team": "a"}}, provider=cfg)  # no secret
    assert opts["headers"] == {"X-Team": "a"}
    _, opts = _options({"headers": {"Authorization": "Bearer t"}}, provider=cfg)  # own host
    assert opts["base_url"] == cfg["base_url"]
    allowed = {**cfg, "headers": {"Authorization": "x"}, "allowed_hosts": ["evil.example"]}
    assert _options(elsewhere, provider=allowed)[1]["base_url"] == elsewhere["base_url"]


def test_config_masks_a_credential_header_and_a_bad_one_exits_2(tmp_path: Path) -> None:
    """``ai-lease config`` shows header names, never a credential's value; a bad header in
    the settings exits 2 naming it."""
    for name in ("Authorization", "X-Auth-Token", "Ocp-Apim-Subscription-Key"):
        env = {"AI_LEASE_PROVIDER__HEADERS": f'{{"{name}": "Bearer hush-hush-42", "X-T": "t"}}'}
        out = run_cli("config", cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
        assert '"X-T": "t"' in out.stdout and "hush-hush-42" not in out.stdout, out.stdout
        assert "hush-hush-42" not in redact(f"{name}: Bearer hush-hush-42")
    bad = run_cli("config", cwd=tmp_path, env={"AI_LEASE_PROVIDER__HEADERS": '{"X A": "1"}'})
    assert bad.returncode == 2 and "provider.headers" in bad.stderr, bad.stderr


def _sdk_too_old_to_drop() -> bool:
    """openai before 3.20 sends its own headers even when extra_headers omits them."""
    from importlib.metadata import version

    return tuple(int(p) for p in version("openai").split(".")[:2]) < (3, 20)
