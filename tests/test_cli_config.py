"""`ai-lease config` prints the effective settings with every secret masked, URL-embedded
passwords included."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from ai_lease.cli.app import main
from ai_lease.redaction import MASK

PASSWORD = "hunter2-CANARY"


@pytest.mark.parametrize(
    ("variable", "url", "shown"),
    [
        (
            "AI_LEASE_PROVIDER__BASE_URL",
            f"http://bob:{PASSWORD}@llm.internal:8080/v1",
            "http://bob:***@llm.internal:8080/v1",
        ),
        (
            "AI_LEASE_PROVIDER__BASE_URL",
            f"https://llm.internal/v1?api_key={PASSWORD}&region=eu",
            "https://llm.internal/v1?api_key=***&region=eu",
        ),
        (
            "AI_LEASE_STORE__URL",
            f"redis://:{PASSWORD}@cache:6379/0",
            "redis://:***@cache:6379/0",
        ),
        ("AI_LEASE_PROVIDER__BASE_URL", f"http://[bad:{PASSWORD}@x", "http://***"),
        (  # libpq's sslpassword: the passphrase of the client certificate's key
            "AI_LEASE_STORE__URL",
            f"postgresql://db/jobs?sslmode=verify-full&sslpassword={PASSWORD}",
            "postgresql://db/jobs?sslmode=verify-full&sslpassword=***",
        ),
    ],
)
def test_config_masks_passwords_in_urls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, url: str, shown: str
) -> None:
    """A base_url or store URL with user:password@ (or a key in its query) is shown with
    the password as ***; the rest of the URL and of the settings stays readable."""
    monkeypatch.chdir(tmp_path)
    env = {variable: url, "AI_LEASE_PROVIDER__API_KEY": "sk-" + PASSWORD}
    out = CliRunner().invoke(main, ["config"], env=env)
    assert out.exit_code == 0, out.output
    assert PASSWORD not in out.output
    settings = orjson.loads(out.output)
    section, field = variable.removeprefix("AI_LEASE_").lower().split("__")
    assert settings[section][field] == shown
    assert settings["lease"]["ttl"] == 30.0 and settings["provider"]["api_key"] == MASK


def test_config_defaults_prints_the_shipped_annotated_file(tmp_path: Path) -> None:
    """`config --defaults` prints the default settings file shipped in the package, and
    every value in it loads as the built-in default."""
    from ai_lease.settings import Settings, load_settings

    out = CliRunner().invoke(main, ["config", "--defaults"])
    assert out.exit_code == 0, out.output
    assert out.output.startswith("# ai_lease defaults")
    written = tmp_path / "defaults.toml"
    written.write_text(out.output, encoding="utf-8")
    assert load_settings(written, env={}) == Settings()
