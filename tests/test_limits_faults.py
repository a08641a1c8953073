"""A slot held by a job whose worker process dies or freezes (issue 29, the third measurement):
a real ``ai-lease worker`` holds the one slot of a server mid-stream; SIGKILLed, its slot is
free again within the lease's ttl and the next caller gets it; SIGSTOPped, the next caller
gets it within the ttl too, and once the frozen worker runs again it does not hold a second
one beside it (its renewal is refused: the slot is fenced). On every store."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ai_lease import open_store
from ai_lease.job import Job
from ai_lease.lease.slot_hold import SlotHold
from ai_lease.run.runner import Runner
from tests.harness.fleet import start_workers, worker_logs
from tests.harness.sse_server import Request, Response, Sleep, SSEServer, chat_chunks, sse

REAL_TIME = "a real worker process is killed or frozen in real time; leases lapse by the clock"

pytestmark = pytest.mark.slow

TTL = 2.0
SLACK = 1.5  # a busy machine's scheduling and the store's round trips, beyond the ttl


def _endless(_: Request) -> Response:
    """A stream that keeps making progress for a minute: its slot is held all along."""
    steps: list[object] = []
    for chunk in chat_chunks(["tick "] * 300):
        steps += [chunk, Sleep(0.2)]
    return sse(*steps)  # type: ignore[arg-type]


def _config(tmp_path: Path, store_url: str, base_url: str) -> Path:
    path = tmp_path / "ai-lease.toml"
    path.write_text(
        f'[store]\nurl = "{store_url}"\npoll_interval = 0.05\nop_timeout = 0.4\n\n'
        f"[lease]\nttl = {TTL}\nrenew_interval = 0.5\nself_fence_margin = 0.5\n\n"
        f'[provider]\nname = "openai-compatible"\nbase_url = "{base_url}"\nmodel = "m"\n\n'
        f'[limits."{base_url}"]\nconcurrency = 1\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
async def holding(store_url: str, tmp_path: Path) -> AsyncIterator[tuple[Any, str, Any]]:
    """(store, limit, worker process): a worker mid-stream, holding the server's one slot."""
    async with SSEServer(responder=_endless) as server:
        store = open_store(store_url, op_timeout=2.0, poll_interval=0.05)
        config = _config(tmp_path, store_url, server.base_url)
        await Runner(store).submit(Job("held", input="x", prompt_text="{{ input }}"))
        (proc,) = await start_workers(config, tmp_path, 1)
        try:
            deadline = time.monotonic() + 30
            while (await store.slot_state(server.base_url)).in_use != 1:
                assert proc.returncode is None, worker_logs(tmp_path)
                assert time.monotonic() < deadline, worker_logs(tmp_path)
                await asyncio.sleep(0.05)  # real: the worker starts and calls in real time
            yield store, server.base_url, proc
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            await proc.wait()
            await store.aclose()


async def _next_caller(store: Any, limit: str) -> tuple[SlotHold, float]:
    """Another caller asking for the slot: it, and seconds until it was granted."""
    started = time.monotonic()
    hold = SlotHold(store, limit, "next-caller", capacity=1, ttl=30, max_wait=TTL + 20)
    await hold.__aenter__()
    return hold, time.monotonic() - started


async def test_a_sigkilled_workers_slot_is_free_within_the_ttl(
    holding: tuple[Any, str, Any],
) -> None:
    store, limit, proc = holding
    proc.kill()
    hold, waited = await _next_caller(store, limit)
    try:
        assert waited <= TTL + SLACK, f"the slot came free {waited:.2f}s after the SIGKILL"
        assert (await store.slot_state(limit)).in_use == 1
    finally:
        await hold.__aexit__(None, None, None)
    assert (await store.slot_state(limit)).in_use == 0


async def test_a_frozen_worker_loses_its_slot_and_does_not_take_it_back(
    holding: tuple[Any, str, Any],
) -> None:
    store, limit, proc = holding
    proc.send_signal(signal.SIGSTOP)
    hold, waited = await _next_caller(store, limit)
    try:
        assert waited <= TTL + SLACK, f"the slot came free {waited:.2f}s after the SIGSTOP"
        proc.send_signal(signal.SIGCONT)
        for _ in range(40):  # 2 s of the thawed worker renewing, re-asking, giving back
            assert (await store.slot_state(limit)).in_use == 1  # the next caller's, alone
            await asyncio.sleep(0.05)  # real: the thawed worker runs in real time
    finally:
        await hold.__aexit__(None, None, None)
