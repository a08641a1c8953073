"""Model servers nobody here wrote, as child processes on 127.0.0.1: llama-cpp-python's server
and LiteLLM's proxy in front of it, each from the servers' venv (``.venv-servers``, or the
Python that ``REAL_SERVERS_PYTHON`` names), never the test venv: their pins would fight
ours.

    python = servers_python()                 # fails (never skips) when the venv is missing
    model = write_tiny_model(python, tmp / "tiny.gguf")
    with LlamaServer(python, model, log=tmp / "llama.log") as llama:
        httpx.get(f"{llama.base_url}/models")
        mark = llama.log_mark()
        ...
        llama.wait_log("Disconnected from client", since=mark)

Each server's stdout and stderr go to its log file, unbuffered: the tests read what the
server itself says it did (a client's disconnect, an interrupted stream).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx

from tests.harness.redis_server import free_port

__all__ = [
    "LiteLLMProxy",
    "LlamaServer",
    "ServerProcess",
    "cli_env",
    "servers_python",
    "write_tiny_model",
]

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
MODEL = "tiny"  # the name every server here answers to
SETUP_HINT = "run scripts/test.sh, which installs it"


def servers_python() -> Path:
    """The servers' Python: ``$REAL_SERVERS_PYTHON`` or ``<repo>/.venv-servers``.

    Raises RuntimeError (the fixtures turn it into a failure, never a skip) when it is
    missing or lacks llama-cpp-python's server."""
    named = os.environ.get("REAL_SERVERS_PYTHON")
    python = Path(named) if named else REPO / ".venv-servers" / "bin" / "python"
    where = "REAL_SERVERS_PYTHON" if named else "the servers' venv"
    if not python.is_file():
        raise RuntimeError(
            f"{where}: no Python at {python}; the real-server tests need llama-cpp-python's "
            f"server from tests/realservers/requirements.txt there ({SETUP_HINT})"
        )
    probe = subprocess.run(
        [str(python), "-c", "import llama_cpp.server, gguf"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        raise RuntimeError(
            f"{where} ({python}) cannot import llama_cpp.server and gguf: "
            f"{probe.stderr.strip()[-400:]} ({SETUP_HINT})"
        )
    return python


def cli_env(**settings: str) -> dict[str, str]:
    """The environment of an ``ai-lease`` child: this one without any ``AI_LEASE_*``
    variable (a developer's own settings must not steer the suite), plus ``settings``
    (``AI_LEASE_PROVIDER__NAME=…``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    return env | settings


def write_tiny_model(python: Path, path: Path) -> Path:
    """Write the tiny random-weight GGUF (tests/realservers/tiny_gguf.py) to ``path``."""
    script = Path(__file__).with_name("tiny_gguf.py")
    subprocess.run([str(python), str(script), str(path)], check=True, timeout=120)
    return path


class ServerProcess:
    """A child process with a log file, ready once ``ready_url`` answers 200."""

    ready_timeout_s = 120.0

    def __init__(self, argv: list[str], log: Path, ready_url: str) -> None:
        self.argv = argv
        self.log = log
        self.ready_url = ready_url
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        # LiteLLM would fetch its model price map from the network at start: use its own copy.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.log.parent
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.argv[:4]} exited with {self.process.returncode}:\n{self.tail()}"
                )
            try:
                if httpx.get(self.ready_url, timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.argv[:4]} not ready in {self.ready_timeout_s} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, chars: int = 3000) -> str:
        return self.text()[-chars:]

    def log_mark(self) -> int:
        """Where the log ends now: pass it as ``since`` to look only at what follows."""
        return len(self.text())

    def wait_log(self, pattern: str, *, since: int = 0, timeout: float = 20.0) -> re.Match[str]:
        """The first match of ``pattern`` in the log after ``since``, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text()[since:])
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the server never logged {pattern!r} in {timeout} s:\n{self.tail()}"
                )
            time.sleep(0.05)


class LlamaServer(ServerProcess):
    """``python -m llama_cpp.server`` on a free port, one slot (its default), serving
    ``model`` as ``tiny`` with a context of ``n_ctx`` tokens."""

    def __init__(self, python: Path, model: Path, *, log: Path, n_ctx: int) -> None:
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}/v1"
        argv = [str(python), "-m", "llama_cpp.server", "--model", str(model)]
        argv += ["--model_alias", MODEL, "--host", HOST, "--port", str(self.port)]
        argv += ["--n_ctx", str(n_ctx), "--n_threads", "1", "--n_batch", "64"]
        super().__init__(argv, log, f"{self.base_url}/models")


class LiteLLMProxy(ServerProcess):
    """LiteLLM's proxy on a free port, routing model ``tiny`` to ``upstream`` (an
    OpenAI-compatible base URL) and serving it as OpenAI chat, Anthropic Messages and
    Responses. The route is ``custom_openai/``: with ``openai/`` (or ``hosted_vllm/``) the
    proxy forwards a Responses request as one to the upstream's ``/v1/responses``, which
    llama-cpp-python's server does not have (404); ``custom_openai/`` bridges it to chat
    completions."""

    ready_timeout_s = 180.0  # the proxy imports a great deal before it listens

    def __init__(self, python: Path, upstream: str, *, log: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        config = log.with_suffix(".yaml")
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: custom_openai/{MODEL}\n"
            f"      api_base: {upstream}\n"
            "      api_key: none\n"
            "litellm_settings:\n"
            "  num_retries: 0\n"
            "  request_timeout: 60\n"
        )
        litellm = python.with_name("litellm")
        argv = [str(litellm), "--config", str(config), "--host", HOST, "--port", str(self.port)]
        super().__init__(argv, log, f"{self.base_url}/health/liveliness")
