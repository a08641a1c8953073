"""Canary secrets: an API key and a Redis password that must never be written anywhere.

Scenario 11: a run with faults that make ai_lease write errors (a 503 from the model, a
black hole between the owner and Redis, a self-fence, a takeover) uses an API key
``sk-CANARY-…`` and a password-protected Redis; neither canary may appear in any history
file, any process's stdout/stderr, or any value stored in Redis.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.harness.chaos_cluster import PROFILE, ChaosCluster, check_job, report
from tests.harness.chaos_proxy import ChaosProxy
from tests.harness.history import of_kind
from tests.harness.redis_server import RedisServer
from tests.harness.sse_server import SSEServer, chat_chunks, drip, json_response, sse

pytestmark = [pytest.mark.chaos, pytest.mark.redis]

API_KEY = f"sk-CANARY-{secrets.token_hex(8)}"
PASSWORD = f"CANARY-pw-{secrets.token_hex(8)}"
CANARIES = (API_KEY, PASSWORD, API_KEY.removeprefix("sk-"), PASSWORD.removeprefix("CANARY-"))
KEY = "secret-job"


@pytest.fixture
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server


@pytest.fixture
async def server() -> AsyncIterator[SSEServer]:
    async with SSEServer() as running:
        yield running


async def stored_values(url: str) -> list[str]:
    """Every key and value held by the Redis at ``url``, whatever their types."""
    client = aioredis.from_url(url, decode_responses=True)
    out: list[str] = []
    try:
        async for name in client.scan_iter(count=500):
            out.append(name)
            kind = await client.type(name)
            if kind == "hash":
                out += [f"{k}={v}" for k, v in (await client.hgetall(name)).items()]
            elif kind == "string":
                out.append(str(await client.get(name)))
            elif kind == "zset":
                out += await client.zrange(name, 0, -1)
            elif kind == "set":
                out += list(await client.smembers(name))
            elif kind == "list":
                out += await client.lrange(name, 0, -1)
    finally:
        await client.aclose()
    return out


async def test_canary_secrets_never_leak(
    locked_redis: RedisServer, server: SSEServer, tmp_path: Path
) -> None:
    """API key and Redis password appear in no history, no process output, no stored value."""
    server.enqueue(
        json_response(503, {"error": {"message": "overloaded"}}),
        sse(*drip("slow answer that will not finish", every=0.3, chunk_size=3)),
        sse(*chat_chunks(["the ", "answer"])),
    )
    env = {"CHAOS_API_KEY": API_KEY}
    async with (
        ChaosProxy(locked_redis.host, locked_redis.port) as proxy,
        ChaosCluster(locked_redis.url, tmp_path / "run") as cluster,
    ):
        cluster.directory.mkdir()
        b = await cluster.start_ready("B", [KEY], sse_url=server.base_url, env=env)
        a = await cluster.start(
            "A", [KEY], store_url=proxy.url_for(password=PASSWORD), sse_url=server.base_url, env=env
        )
        await a.wait_for_event("acquired", "A to own the job")
        cluster.go()
        await a.wait_for(
            lambda evs: [e for e in of_kind(evs, "renewed") if e["stage"] == "call_ai"],
            "A to stream",
        )
        proxy.black_hole()
        await a.wait_for_event("self_fenced", "A to fence itself", timeout=10)
        await b.wait_for_event("committed", "B to commit", timeout=10)
        proxy.heal()
        assert await a.exited() == 0, a.dump()
        assert await b.exited() == 0, b.dump()
        histories = cluster.histories()
        verdict = await check_job(locked_redis.url, KEY, histories, ttl=PROFILE["ttl"])
    assert verdict.record.output == "the answer"
    sent = [r.headers.get("authorization", "") for r in server.requests]
    assert sent and all(h == f"Bearer {API_KEY}" for h in sent), "the canary key was not used"
    failures = of_kind(histories["A"], "renew_failed")
    assert failures, "no store error was written"
    assert "redis://:***@" in failures[0]["detail"], "the store's URL was not written masked"
    written = {p.name: p.read_text(errors="replace") for p in cluster.directory.iterdir()}
    values = await stored_values(locked_redis.url)
    for canary in CANARIES:
        for name, text in written.items():
            assert canary not in text, f"a canary leaked into {name}"
        leaked = [v[:80] for v in values if canary in v]
        assert not leaked, f"a canary leaked into Redis: {leaked}"
    report(
        "canary secrets",
        locked_redis.url.replace(PASSWORD, "***"),
        files_scanned=len(written),
        redis_values_scanned=len(values),
    )
