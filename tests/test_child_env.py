"""Process-isolation children get an allow-listed environment: the provider's and the store's
settings and the process basics, never the worker's other secrets (a cloud credential, the
dashboard's token) — neither in ``os.environ`` nor in the block they were started with."""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from pathlib import Path

import orjson

from ai_lease.run.isolation.env import allowed, only_allowed
from ai_lease.stores import open_store
from tests.test_log_json_whole import CliWorker, submit_detached

REAL_TIME = "the jobs run in child processes; the test polls their store"


AWS = "canary-aws-7d1e0c9b"
UI_TOKEN = "canary-ui-3f5a8e21b6c4d907"
PROVIDER_KEY = "sk-kept-for-the-provider-0a1b2c"

PROBE = """
import os
from ai_lease.providers.base import Completion, Delta

def _seen():
    with open("/proc/self/environ", "rb") as f:
        started_with = f.read().decode(errors="replace")
    now = "\\n".join(f"{k}={v}" for k, v in os.environ.items())
    return {
        "now": [c for c in CANARIES if c in now],
        "started_with": [c for c in CANARIES if c in started_with],
        "path": "PATH" in os.environ,
        "provider_key": os.environ.get("OPENAI_API_KEY"),
        "pid": os.getpid(),
    }

class Probe:
    name = "envprobe"
    async def stream(self, request):
        import json
        yield Delta(text=json.dumps(_seen()))
        yield Delta(finish_reason="stop")
    async def complete(self, request):
        import json
        return Completion(text=json.dumps(_seen()), finish_reason="stop")
    async def aclose(self):
        pass

def make(**options):
    return Probe()
"""


def _plugin(where: Path) -> None:
    """The probe provider, found by its entry point on PYTHONPATH."""
    canaries = f"CANARIES = {[AWS, UI_TOKEN]!r}\n"
    (where / "envprobe.py").write_text(canaries + textwrap.dedent(PROBE))
    dist = where / "envprobe-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: envprobe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ai_lease.providers]\nenvprobe = envprobe:make\n")


async def _result(url: str, key: str, timeout: float) -> dict[str, object]:
    store = open_store(url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            job = await store.get(key)
            if job is not None and job.status.terminal:
                assert job.result is not None, job
                text = orjson.loads(job.result)
                return dict(orjson.loads(text))
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.1)
    finally:
        await store.aclose()


def test_a_child_never_sees_the_workers_other_secrets(tmp_path: Path) -> None:
    """`ai-lease worker --isolation process` with AWS_SECRET_ACCESS_KEY and
    AI_LEASE_UI__TOKEN set: the job's provider, in the child, finds neither (in os.environ or
    /proc/self/environ); PATH and the provider's own key are there."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    _plugin(plugins)
    (tmp_path / "job.toml").write_text('key = "probe"\nprompt = "summarize"\ninput = "x"\n')
    extra = {
        "PYTHONPATH": str(plugins),
        "AI_LEASE_PROVIDER__NAME": "envprobe",
        "AWS_SECRET_ACCESS_KEY": AWS,
        "AI_LEASE_UI__TOKEN": UI_TOKEN,
        "OPENAI_API_KEY": PROVIDER_KEY,
    }
    url = submit_detached(tmp_path, extra)
    worker = CliWorker(url, "--isolation", "process", "-c", "1", cwd=tmp_path, extra=extra)
    try:
        seen = asyncio.run(_result(url, "probe", timeout=60))
    finally:
        worker.stop()
    assert seen["pid"] != worker.proc.pid  # it ran in a child
    assert seen["now"] == [] and seen["started_with"] == [], seen
    assert seen["path"] is True and seen["provider_key"] == PROVIDER_KEY, seen


def test_the_allow_list() -> None:
    """Basics, locale, PYTHON*, the provider's and store's settings and the built-in
    providers' keys are kept; other secrets and the dashboard's settings are not; `keep`
    globs add names."""
    environ = {
        "PATH": "/bin",
        "LC_ALL": "C",
        "PYTHONPATH": "/p",
        "AI_LEASE_PROVIDER__MODEL": "m",
        "AI_LEASE_STORE__URL": "sqlite:///x",
        "ANTHROPIC_API_KEY": "a",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AI_LEASE_UI__TOKEN": "t",
        "GITHUB_TOKEN": "g",
        "MY_PLUGIN_URL": "u",
    }
    kept = set(allowed(environ))
    assert kept == {
        "PATH",
        "LC_ALL",
        "PYTHONPATH",
        "AI_LEASE_PROVIDER__MODEL",
        "AI_LEASE_STORE__URL",
        "ANTHROPIC_API_KEY",
    }
    assert set(allowed(environ, keep=["MY_PLUGIN_*"])) == kept | {"MY_PLUGIN_URL"}


def test_only_allowed_restores_the_environment() -> None:
    """The worker's own environment is back, whole, after a start under only_allowed."""
    os.environ["AI_LEASE_TEST_CANARY"] = "x"
    before = dict(os.environ)
    try:
        with only_allowed():
            assert "AI_LEASE_TEST_CANARY" not in os.environ
        assert dict(os.environ) == before
    finally:
        del os.environ["AI_LEASE_TEST_CANARY"]
