"""When ai_lease gives up on a call — its total stream budget ran out, or its process was
SIGKILLed — llama-cpp-python's server sees the connection close and stops generating (it logs
``Disconnected from client``), on each OpenAI path. No other request is in flight, so nothing
else can have cut the stream (the server logs the same line when a new request interrupts)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ai_lease
from ai_lease.retry import RetryPolicy
from ai_lease.run.config import RunConfig
from ai_lease.timeouts import StreamTimeouts
from tests.realservers.conftest import N_CTX, OPENAI_PATHS
from tests.realservers.direct import run_job
from tests.realservers.servers import MODEL, LlamaServer, cli_env

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(300)]

PROMPT = "Tell me about the lighthouse"
LONG = N_CTX - 100  # tokens: seconds of generation for the tiny model on one thread
DISCONNECTED = r"Disconnected from client"
ONCE = RetryPolicy(attempts=1)


async def test_total_timeout_makes_the_server_stop(
    llama: LlamaServer, openai_path: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    """A stream cut by ai_lease's total budget closes the connection: the server stops."""
    job = ai_lease.Job(
        "slow", input=PROMPT, prompt_text="{{ input }}", temperature=0.0, max_tokens=LONG
    )
    mark = llama.log_mark()
    with pytest.raises(ai_lease.JobFailed) as failed:
        await run_job(
            tmp_path / "s.db",
            llama.base_url,
            openai_path,
            job,
            config=RunConfig(
                stream_timeouts=StreamTimeouts(total=0.5), retry=ONCE, call_retry=ONCE
            ),
        )
    assert "total" in str(failed.value), failed.value
    llama.wait_log(DISCONNECTED, since=mark, timeout=15)


@pytest.mark.parametrize("path", sorted(OPENAI_PATHS))
def test_sigkilled_owner_disconnects(llama: LlamaServer, tmp_path: Path, path: str) -> None:
    """`ai-lease submit` SIGKILLed mid-stream: the server sees the disconnect and stops."""
    name, options = OPENAI_PATHS[path]
    job = tmp_path / "job.toml"
    job.write_text(
        f'key = "killed"\ninput = "{PROMPT}"\nprompt_text = "{{{{ input }}}}"\n'
        f"temperature = 0.0\nmax_tokens = {LONG}\n"
    )
    env = cli_env(
        AI_LEASE_STORE__URL=f"sqlite:///{tmp_path / 's.db'}",
        AI_LEASE_PROVIDER__NAME=name,
        AI_LEASE_PROVIDER__BASE_URL=llama.base_url,
        AI_LEASE_PROVIDER__MODEL=MODEL,
    )
    env |= {f"AI_LEASE_PROVIDER__{k.upper()}": str(v) for k, v in options.items()}
    cli = Path(sys.executable).with_name("ai-lease")
    mark = llama.log_mark()
    out = tmp_path / "owner.log"
    with out.open("wb") as log:
        owner = subprocess.Popen(
            [str(cli), "submit", str(job)], env=env, cwd=tmp_path, stdout=log, stderr=log
        )
    try:
        llama.wait_log(r"POST /v1/chat/completions", since=mark, timeout=60)
        time.sleep(0.3)  # tokens are flowing
        assert owner.poll() is None, f"the owner ended before it was killed:\n{out.read_text()}"
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        llama.wait_log(DISCONNECTED, since=mark, timeout=15)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(10)
