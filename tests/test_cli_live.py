"""`ai-lease submit` on a terminal (a pseudo-terminal as stderr), through the real entry
point: the live panel ends with the summary line, and the answer is printed once."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_on_a_terminal(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; returns exit code, stdout, terminal."""
    master, slave = pty.openpty()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ai_lease", *args],
        cwd=cwd,
        env=clean | {"TERM": "xterm", "COLUMNS": "120"} | (env or {}),
        stdout=subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its side
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=60)
    reader.join(10)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(seen).decode(errors="replace")


def test_submit_on_a_terminal_prints_the_answer_once(tmp_path: Path) -> None:
    """The panel's last frame is the summary (DONE, chunks, tokens, attempt), not the
    streamed text; the answer is on stdout exactly once."""
    (tmp_path / "article.txt").write_text((REPO / "examples" / "article.txt").read_text())
    (tmp_path / "job.toml").write_text(
        'key = "job-1"\nprompt = "summarize"\ninput_file = "article.txt"\n'
        "[variables]\nsentences = 2\n"
    )
    code, out, screen = run_on_a_terminal("submit", "job.toml", cwd=tmp_path)
    assert code == 0, screen
    answer = out.strip()
    assert answer and out.count(answer) == 1
    final = screen.split("\x1b[2K")[-1]  # rich erases the previous frame before each redraw
    assert "DONE in " in final and " chunks · " in final and "attempt 1" in final, final
    start = answer[:30]  # on one line of the panel, however it wraps
    assert start not in final
    assert start in screen  # it was shown while it streamed


async def test_the_panel_between_attempts_is_the_runners_own(tmp_path: Path) -> None:
    """The real runner and the real panel together (the panel's unit tests feed it written
    events): a first attempt whose three calls all get a 503 is followed on the terminal by
    "retrying in N s (attempt 2/3)", then the second attempt's answer and "attempt 2"."""
    from tests.harness.sse_server import SSEServer, chat_chunks, raw, sse

    (tmp_path / "job.toml").write_text(
        'key = "flaky"\ninput = "the text"\nprompt_text = "{{ input }}"\n'
    )
    async with SSEServer() as server:
        for _ in range(3):  # one attempt's calls (ai_lease.retry.MODEL_CALL: 3 tries)
            server.enqueue(raw(503, b'{"error": {"message": "overloaded"}}'))
        server.enqueue(sse(*chat_chunks(["second ", "attempt"], usage=(5, 2))))
        env = {
            "AI_LEASE_PROVIDER__NAME": "openai-compatible",
            "AI_LEASE_PROVIDER__BASE_URL": server.base_url,
            "AI_LEASE_PROVIDER__MODEL": "m",
        }
        code, out, screen = await asyncio.to_thread(
            run_on_a_terminal, "submit", "job.toml", cwd=tmp_path, env=env
        )
        sent = len(server.requests)
    assert code == 0, screen
    assert out.strip() == "second attempt" and sent == 4, (out, sent)
    assert re.search(r"retrying in \d+(\.\d+)? s \(attempt 2/3\)", screen), screen
    final = screen.split("\x1b[2K")[-1]
    assert "DONE in " in final and "attempt 2" in final, final
