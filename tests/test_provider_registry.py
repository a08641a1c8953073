"""Finding providers by name: built-ins, and third-party ones through an entry point."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from ai_lease import ConfigError
from ai_lease.providers import available_providers, create_provider
from ai_lease.providers.local import LocalExtractiveProvider
from ai_lease.providers.openai_compat import OpenAICompatProvider


def test_builtins_are_listed_and_created() -> None:
    """The built-in names resolve to their adapters."""
    assert {"local-extractive", "openai", "openai-compatible"} <= set(available_providers())
    assert isinstance(create_provider("local-extractive"), LocalExtractiveProvider)
    compat = create_provider("openai-compatible", base_url="http://127.0.0.1:9/v1", model="m")
    assert isinstance(compat, OpenAICompatProvider)


def test_unknown_provider_names_the_known_ones() -> None:
    """An unknown name is a config error listing every known provider."""
    with pytest.raises(ConfigError, match=r"unknown provider 'nope'.*local-extractive"):
        create_provider("nope")


def test_openai_without_key_is_a_clear_config_error() -> None:
    """OpenAI with no API key fails at once, saying where to put one."""
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        create_provider("openai")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        create_provider("openai-compatible")


def test_third_party_provider_is_found_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed distribution declaring ai_lease.providers is picked up by name."""
    (tmp_path / "acme_llm.py").write_text(
        textwrap.dedent(
            """
            class AcmeProvider:
                name = "acme"
                def __init__(self, **options):
                    self.options = options
                async def stream(self, request):
                    yield
                async def complete(self, request):
                    raise RuntimeError
                async def aclose(self):
                    pass

            def make(**options):
                return AcmeProvider(**options)
            """
        )
    )
    dist = tmp_path / "acme_llm-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-llm\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nacme = acme_llm:make\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "acme" in available_providers()
    provider = create_provider("acme", model="rocket-1", base_url=None)
    assert type(provider).__name__ == "AcmeProvider"
    assert provider.options == {"model": "rocket-1"}  # type: ignore[attr-defined]
    sys.modules.pop("acme_llm", None)


def test_the_sdk_adapter_uses_only_the_sdks_public_api() -> None:
    """No private module or hook of the openai package (they change without notice)."""
    import ast
    import inspect

    from ai_lease.providers import openai_sdk, sdk_events

    for module in (openai_sdk, sdk_events):
        tree = ast.parse(inspect.getsource(module))
        imported = [
            node.module or ""
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("openai")
        ]
        assert not [name for name in imported if "._" in name], imported
        private = [
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and isinstance(node.value, ast.Name)
            and node.value.id in ("openai", "httpx2")
        ]
        assert not private, private
        assert "_make_sse_decoder" not in inspect.getsource(module)


def test_cli_lists_every_builtin_with_its_wire_format() -> None:
    """`ai-lease providers` prints each built-in beside the wire format it speaks."""
    from click.testing import CliRunner

    from ai_lease.cli.app import main
    from ai_lease.providers import BUILTINS

    out = CliRunner().invoke(main, ["providers"])
    assert out.exit_code == 0, out.output
    lines = {line.split()[0]: line for line in out.output.splitlines()}
    for name, builtin in BUILTINS.items():
        assert builtin.wire in lines[name], lines
