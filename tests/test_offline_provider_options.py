"""Every provider takes the common settings or refuses them with exit 2 (issue 24, item 2):
the offline provider with a model configured, a plug-in given an option it does not take."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ai_lease import Status, open_store
from ai_lease.errors import ConfigError
from ai_lease.providers import create_provider

REAL_TIME = "the worker runs as a subprocess"


REPO = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    return env | extra


def _cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "article.txt").write_text((REPO / "examples" / "article.txt").read_text())
    (tmp_path / "job.toml").write_text((REPO / "examples" / "summarize.toml").read_text())
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        ((), {"AI_LEASE_PROVIDER__MODEL": "gpt-4o-mini"}),
        (("--model", "gpt-4o-mini"), {}),
    ],
)
def test_the_offline_provider_runs_with_a_model_configured(
    workdir: Path, flags: tuple[str, ...], env: dict[str, str]
) -> None:
    """`submit` on local-extractive with a model set (settings or --model): exit 0, a summary."""
    url = f"sqlite:///{workdir / 'jobs.db'}"
    out = _cli(workdir, "--store", url, "submit", "job.toml", "--quiet", *flags, **env)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stdout.strip()) > 40, out.stdout


def test_the_offline_provider_records_no_model_that_never_ran() -> None:
    """A model given to local-extractive is ignored: the provider claims no model."""
    provider = create_provider(
        "local-extractive", model="gpt-4o-mini", temperature=0.5, max_tokens=9, headers={"X": "1"}
    )
    assert getattr(provider, "model", None) is None


def test_the_offline_provider_refuses_a_base_url(workdir: Path) -> None:
    """local-extractive with a base URL: exit 2 saying it calls no server, no traceback."""
    url = f"sqlite:///{workdir / 'jobs.db'}"
    env = {"AI_LEASE_PROVIDER__BASE_URL": "http://127.0.0.1:9/v1"}
    out = _cli(workdir, "--store", url, "submit", "job.toml", **env)
    assert out.returncode == 2, out.stderr
    assert "offline and calls no server" in out.stderr and "Traceback" not in out.stderr


async def test_a_worker_started_with_a_model_runs_offline_jobs(workdir: Path) -> None:
    """`ai-lease worker` with AI_LEASE_PROVIDER__MODEL on local-extractive starts and runs jobs."""
    url = f"sqlite:///{workdir / 'jobs.db'}"
    env = {"AI_LEASE_PROVIDER__MODEL": "gpt-4o-mini"}
    submitted = _cli(workdir, "--store", url, "submit", "--detach", "job.toml", **env)
    assert submitted.returncode == 0, submitted.stderr
    proc = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "ai_lease", "--store", url, "worker", "--sweep-interval", "0.1"],
        cwd=workdir,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    store = open_store(url)
    try:
        deadline = time.monotonic() + 60
        record = await store.get("example-summary")
        while (record is None or not record.status.terminal) and proc.returncode is None:
            assert time.monotonic() < deadline, "the job did not end within 60 s"
            await asyncio.sleep(0.2)
            record = await store.get("example-summary")
    finally:
        await store.aclose()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert record is not None and record.status is Status.DONE, err.decode()


def _plugin(tmp_path: Path) -> Path:
    """A plug-in package whose factory takes only ``base_url``, registered by entry point."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "narrow_llm.py").write_text(
        textwrap.dedent(
            """
            def make(*, base_url=None):
                raise AssertionError("never called with options it does not take")
            """
        )
    )
    dist = site / "narrow_llm-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: narrow-llm\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nnarrow = narrow_llm:make\n")
    return site


def test_a_plugin_given_an_option_it_does_not_take_exits_2(workdir: Path) -> None:
    """A plug-in factory without a ``model`` parameter, a model configured: exit 2 naming
    the option and what the factory takes, not a TypeError traceback."""
    site = _plugin(workdir)
    url = f"sqlite:///{workdir / 'jobs.db'}"
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "AI_LEASE_PROVIDER__NAME": "narrow",
        "AI_LEASE_PROVIDER__MODEL": "m-1",
    }
    out = _cli(workdir, "--store", url, "submit", "job.toml", **env)
    assert out.returncode == 2, out.stderr
    assert "'narrow' does not take the option(s) model" in out.stderr, out.stderr
    assert "takes: base_url" in out.stderr and "Traceback" not in out.stderr


def test_create_provider_names_an_option_no_parameter_takes() -> None:
    """create_provider refuses an option the adapter has no parameter for (ConfigError)."""
    with pytest.raises(ConfigError, match="does not take the option"):
        create_provider("openai", api_key="sk-x", colour="blue")
