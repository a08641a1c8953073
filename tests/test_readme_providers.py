"""The README's job-file example for each provider is a job file that builds its provider."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from ai_lease.cli.jobfile import load_job_file
from ai_lease.cli.provider_options import provider_options
from ai_lease.providers import BUILTINS, create_provider
from ai_lease.settings import load_settings

README = Path(__file__).resolve().parents[1] / "README.md"
KEYS = {
    "OPENAI_API_KEY": "sk-readme",
    "ANTHROPIC_API_KEY": "sk-ant-readme",
    "GEMINI_API_KEY": "g-readme",
}


def provider_blocks() -> list[str]:
    return re.findall(r"```toml\n(\[provider\].*?)```", README.read_text(), flags=re.S)


def test_every_network_provider_has_a_readme_example(tmp_path: Path) -> None:
    """One [provider] example per built-in model adapter, each loading and building it."""
    names = []
    for number, block in enumerate(provider_blocks()):
        job = tmp_path / f"job{number}.toml"
        job.write_text(f'key = "k{number}"\ninput = "x"\nprompt_text = "{{{{ input }}}}"\n' + block)
        spec = load_job_file(job)
        env = {} if "base_url" in spec.provider else KEYS  # a local server takes no key
        name, options = provider_options(load_settings(env={}), dict(spec.provider), env=env)
        provider = create_provider(name, **options)
        asyncio.run(provider.aclose())
        names.append(name)
    assert sorted(names) == sorted(set(BUILTINS) - {"local-extractive"}), names
