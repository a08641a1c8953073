"""A fleet under one ``rpm`` limit (issue 29, the second measurement): eight real
``ai-lease worker`` processes, sixteen jobs each, against a loopback server that allows 60
requests in any 60 seconds and answers the 61st with 429 and a Retry-After, with ``rpm = 60``
for its base URL in the settings they share. On every store: the server never sees more than
60 requests in a minute window, no job fails, and the 429s number at most one per worker.

128 jobs at 60 a minute: the run takes a little over two minutes of real time per store."""

from __future__ import annotations

import bisect
import math
import time
from pathlib import Path

import pytest

from ai_lease import Status, open_store
from ai_lease.job import Job
from ai_lease.run.runner import Runner
from tests.harness.fleet import start_workers, stop_workers, until_ended, worker_logs
from tests.harness.sse_server import Request, Response, SSEServer, chat_chunks, json_response, sse

REAL_TIME = "the server counts requests in real minutes; the workers are real OS processes"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKERS, PER_WORKER = 8, 16
JOBS = WORKERS * PER_WORKER
PER_MINUTE = 60
WINDOW_S = 60.0


class RateLimited:
    """The server's limit: at most 60 requests answered in any 60 s; past it, 429 with a
    Retry-After of the seconds until the oldest leaves the window."""

    def __init__(self) -> None:
        self.seen: list[float] = []  # every request's arrival, refused ones too
        self.answered: list[float] = []
        self.refused = 0

    def __call__(self, request: Request) -> Response:
        now = time.monotonic()
        self.seen.append(now)
        recent = [t for t in self.answered if t > now - WINDOW_S]
        if len(recent) >= PER_MINUTE:
            self.refused += 1
            wait = math.ceil(recent[0] + WINDOW_S - now)
            body = {"error": {"message": "rate limit", "type": "rate_limit_exceeded"}}
            return json_response(429, body, {"Retry-After": str(max(1, wait))})
        self.answered.append(now)
        return sse(*chat_chunks(["within ", "the ", "limit"]))

    def most_in_a_window(self) -> int:
        """The most requests (refused ones too) that arrived within any 60 s."""
        times = self.seen
        return max(bisect.bisect_left(times, t + WINDOW_S) - i for i, t in enumerate(times))


def _settings(tmp_path: Path, store_url: str, base_url: str) -> Path:
    path = tmp_path / "ai-lease.toml"
    path.write_text(
        f'[store]\nurl = "{store_url}"\npoll_interval = 0.2\n\n'
        f'[provider]\nname = "openai-compatible"\nbase_url = "{base_url}"\nmodel = "m"\n\n'
        f'[limits."{base_url}"]\nrpm = {PER_MINUTE}\nmax_wait = 300\n',
        encoding="utf-8",
    )
    return path


async def test_eight_workers_stay_under_the_servers_rpm(store_url: str, tmp_path: Path) -> None:
    server_limit = RateLimited()
    async with SSEServer(responder=server_limit) as server:
        store = open_store(store_url)
        try:
            runner = Runner(store)
            keys = [f"rate-{n:03d}" for n in range(JOBS)]
            for key in keys:
                await runner.submit(Job(key, input=key, prompt_text="{{ input }}"))
            config = _settings(tmp_path, store_url, server.base_url)
            procs = await start_workers(config, tmp_path, WORKERS, "-c", str(PER_WORKER))
            try:
                records = await until_ended(store, keys, tmp_path, 3 * WINDOW_S + 180, 0.5)
            finally:
                await stop_workers(procs)
        finally:
            await store.aclose()
    logs = worker_logs(tmp_path)
    failed = {r.key: r.last_error for r in records if r is not None and r.status != Status.DONE}
    assert not failed, f"{failed}\n{logs}"
    assert len(server_limit.answered) == JOBS
    assert server_limit.most_in_a_window() <= PER_MINUTE
    assert server_limit.refused <= WORKERS, f"{server_limit.refused} answered 429"
