"""`ai-lease demo --ui`: the demo's job in the real dashboard, its takeover drawn as a picture."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.harness.redis_server import free_port


@pytest.mark.slow
async def test_demo_ui_draws_the_takeover_and_stays_up_until_ctrl_c(tmp_path: Path) -> None:
    """The dashboard's job page shows two lanes, the takeover and the rejected late write;
    after the demo it stays up until Ctrl-C, which ends it with the demo's own exit 0. It
    serves on the --port given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AI_LEASE_")}
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "ai_lease", "demo", "--ui", "--no-open", "--json"),
        *("--port", str(port)),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        url = None
        async with asyncio.timeout(120):
            async for raw in proc.stdout:
                line = orjson.loads(raw)
                if line["kind"] == "dashboard":
                    url = line["url"]
                if line["kind"] == "dashboard_lingers":
                    break
        assert url is not None and url.startswith(f"http://127.0.0.1:{port}/jobs/")
        async with httpx.AsyncClient(timeout=10) as client:
            page = (await client.get(url)).text
        svg = page[page.index('<svg id="timeline"') : page.index("</svg>")]
        assert len(re.findall(r'<g class="lane"', svg)) == 2, svg[:2000]
        assert "mark-fenced_write_rejected" in svg and "mark-taken_over" in svg
        assert "mark-committed" in svg
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
