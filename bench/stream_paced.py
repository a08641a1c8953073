"""The paced view of bench/stream_overhead.py: many concurrent streams, one event per write.

    .venv/bin/python bench/stream_overhead.py --mode paced              # 40 streams x 100 ev/s
    .venv/bin/python bench/stream_overhead.py --mode paced --streams 20 --rate 50 --rounds 5

A model sends one event per write, so the client does one socket read (and one HTTP chunk,
one SSE event) per event: per-read costs that a one-``sendall`` burst hides are counted
here. A child process (its CPU is not the client's) plays, on every POST, a role chunk, N
content chunks (N = ``max_tokens``), a finish chunk, a usage chunk and ``[DONE]``, each as
its own HTTP/1.1 chunk, one write every ``1/rate`` seconds. The client runs ``--streams``
of them at once per variant; variants are interleaved round by round and each figure is
the client's CPU (``process_time``) per content event, median over the rounds (with the
min-max spread):

* ``floor``          bare asyncio: ``open_connection``, write the request, ``read()`` to the end
* ``aiohttp bare``   aiohttp ``content`` lines + orjson + ``choices[0].delta.content``, with
                     aiohttp's read timeout (``sock_read``) set, as the lean adapter sets it
* ``compat raw`` / ``compat guard``  the lean adapter on aiohttp, direct / under the guard
* ``httpx raw`` / ``httpx guard``    the lean adapter on httpx
* ``sdk raw`` / ``sdk guard``        the official SDK iterated / ai_lease's SDK adapter guarded
* ``lines raw`` / ``lines guard``    the lean adapter on aiohttp with aiohttp's ``readline()``
  framing in place of its own ``SSEFramer`` over ``readany()``: the measurement that decides whether
  that parser is worth keeping (docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import socket
import statistics
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import openai
import orjson

from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.http_paths import Read
from ai_lease.providers.openai_compat import OpenAICompatProvider
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts

TIMEOUTS = StreamTimeouts(first_token=60, idle=60, total=600)
MESSAGES = [{"role": "user", "content": "Count to a lot."}]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _event(delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1732867200,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [] if usage else [choice],
        "usage": usage,
    }
    data = b"data: " + orjson.dumps(body) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def frames(n: int) -> list[bytes]:
    out = [_event({"role": "assistant", "content": ""}, None)]
    out += [_event({"content": f" w{i % 10}"}, None) for i in range(n)]
    usage = {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": n + 9}
    out += [_event({}, "stop"), _event({}, None, usage)]
    out += [b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]
    return out


async def _serve_one(rate: float, reader: Any, writer: Any) -> None:
    with_cache: dict[int, list[bytes]] = {}
    try:
        while head := await reader.readuntil(b"\r\n\r\n"):
            lines = head.lower().split(b"\r\n")
            length = next(int(x[15:]) for x in lines if x.startswith(b"content-length:"))
            n = int(orjson.loads(await reader.readexactly(length)).get("max_tokens") or 10)
            writer.write(HEAD)
            start, loop = time.monotonic(), asyncio.get_running_loop()
            for i, frame in enumerate(with_cache.setdefault(n, frames(n))):
                delay = start + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(frame)
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def serve(sock: socket.socket, rate: float) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _serve_one(rate, r, w), sock=sock, backlog=4096
        )
        await server.serve_forever()

    asyncio.run(main())


Variant = Callable[[int], Awaitable[int]]


class LineFramer:
    """SSE framing on whole lines (what ``readline()`` hands over): one payload per event."""

    def __init__(self, limit: int) -> None:
        self.data: list[bytes] = []

    def feed(self, line: bytes) -> list[bytes]:
        if line in (b"\n", b"\r\n"):
            data, self.data = self.data, []
            return [data[0] if len(data) == 1 else b"\n".join(data)] if data else []
        if line[:5] == b"data:":
            value = line[5:].rstrip(b"\r\n")
            self.data.append(value[1:] if value[:1] == b" " else value)
        return []

    def close(self) -> list[bytes]:
        return []


class LineFramed(OpenAICompatProvider):
    """The lean adapter reading its aiohttp body with aiohttp's bounded ``readline()``
    framing in place of its own ``SSEFramer`` over ``readany()``."""

    framer = LineFramer  # type: ignore[assignment]

    @contextlib.asynccontextmanager
    async def _open(  # type: ignore[override]
        self, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> AsyncGenerator[Read, None]:
        async with self._aiohttp().post(
            url, data=body, headers=headers, allow_redirects=False
        ) as response:
            readline, limit = response.content.readline, self.max_event_bytes
            yield lambda: readline(max_line_length=limit)


def variants(base_url: str, port: int) -> tuple[dict[str, Variant], list[Any]]:
    # The bare consumer keeps the read timeout a careful user sets (aiohttp's sock_read, the
    # adapter's default 600 s), as the lean adapter does: the same guarantee on both sides.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=600.0),
    )
    lean = OpenAICompatProvider(base_url=base_url, model="b", max_connections=2000)
    lean_httpx = OpenAICompatProvider(
        base_url=base_url, model="b", http="httpx", max_connections=2000
    )
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    adapter = OpenAISDKProvider(base_url=base_url, api_key="x", model="b")
    lines = LineFramed(base_url=base_url, model="b", max_connections=2000)
    url = base_url + "/chat/completions"

    def req(n: int) -> ChatRequest:
        return ChatRequest(messages=MESSAGES, max_tokens=n)

    async def floor(n: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = orjson.dumps({"model": "b", "messages": MESSAGES, "max_tokens": n, "stream": True})
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        tail = b""
        while not tail.endswith(b"0\r\n\r\n"):
            data = await reader.read(65536)
            if not data:
                break
            tail = data[-5:]
        writer.close()
        return n

    async def aiohttp_bare(n: int) -> int:
        body = {"model": "b", "messages": MESSAGES, "max_tokens": n, "stream": True}
        seen = 0
        async with session.post(url, json=body) as response:
            async for line in response.content:
                if line[:6] != b"data: " or line[6:12] == b"[DONE]":
                    continue
                choices = orjson.loads(line[6:])["choices"]
                seen += bool(choices and choices[0]["delta"].get("content"))
        return seen

    async def raw_batches(provider: Any, n: int) -> int:
        return sum(
            1
            for batch in [b async for b in provider.stream_batches(req(n))]
            for d in batch
            if d.text
        )

    async def guarded(provider: Any, n: int) -> int:
        return (await StreamGuard(TIMEOUTS, Progress()).call(provider, req(n))).chunks

    async def sdk_raw(n: int) -> int:
        stream: Any = await sdk.chat.completions.create(
            model="b", messages=MESSAGES, max_tokens=n, stream=True
        )
        return len([1 async for c in stream if c.choices and c.choices[0].delta.content])

    out: dict[str, Variant] = {
        "floor": floor,
        "aiohttp bare": aiohttp_bare,
        "compat raw": lambda n: raw_batches(lean, n),
        "compat guard": lambda n: guarded(lean, n),
        "httpx raw": lambda n: raw_batches(lean_httpx, n),
        "httpx guard": lambda n: guarded(lean_httpx, n),
        "sdk raw": sdk_raw,
        "sdk guard": lambda n: guarded(adapter, n),
        "lines raw": lambda n: raw_batches(lines, n),
        "lines guard": lambda n: guarded(lines, n),
    }
    closers = [session.close, lean.aclose, lean_httpx.aclose, lines.aclose]
    return out, [*closers, sdk.close, adapter.aclose]


async def measure(args: argparse.Namespace, base_url: str, port: int) -> dict[str, list[float]]:
    table, closers = variants(base_url, port)
    cpu: dict[str, list[float]] = {name: [] for name in table}
    n = int(args.rate * args.seconds)
    try:
        for fn in table.values():
            await asyncio.gather(*(fn(5) for _ in range(args.streams)))  # warm connections
        for _ in range(args.rounds):
            for name, fn in table.items():
                gc.collect()
                c0 = time.process_time()
                seen = await asyncio.gather(*(fn(n) for _ in range(args.streams)))
                used = time.process_time() - c0
                if name != "floor" and seen != [n] * args.streams:
                    raise RuntimeError(f"bench: {name} saw {seen[:3]}..., expected {n} each")
                cpu[name].append(used / (n * args.streams) * 1e6)
    finally:
        for close in closers:
            await close()
    return cpu


def report(cpu: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"{'variant':<14} {'CPU µs/event':>12}  spread (min-max)")
    for name, values in cpu.items():
        print(f"{name:<14} {med[name]:>12.1f}  {min(values):.1f}-{max(values):.1f}")

    def ratio(a: str, b: str) -> float:  # per-round ratios, median: machine drift cancels
        return statistics.median(x / y for x, y in zip(cpu[a], cpu[b], strict=True))

    # "guarded / raw" as a throughput ratio: raw CPU / guarded CPU (>= 0.95 is the target)
    checks = [
        ("compat guarded/raw", ratio("compat raw", "compat guard"), ">=", 0.95),
        ("httpx guarded/raw", ratio("httpx raw", "httpx guard"), ">=", 0.95),
        ("sdk guarded/raw", ratio("sdk raw", "sdk guard"), ">=", 0.95),
        ("compat guard CPU / aiohttp bare", ratio("compat guard", "aiohttp bare"), "<=", 1.1),
        ("compat guard CPU / floor", ratio("compat guard", "floor"), "<=", 1.6),
        ("sdk raw CPU / compat guard", ratio("sdk raw", "compat guard"), ">=", 5.0),
        ("compat raw CPU / aiohttp bare", ratio("compat raw", "aiohttp bare"), "", 0),
        ("httpx guard CPU / compat guard", ratio("httpx guard", "compat guard"), "", 0),
        ("lines guard CPU / compat guard", ratio("lines guard", "compat guard"), "", 0),
    ]
    print()
    for text, value, op, target in checks:
        if not op:
            print(f"RATIO {text}: {value:.3f}")
            continue
        ok = value >= target if op == ">=" else value <= target
        print(f"VERDICT {'ok' if ok else 'miss'} {text}: {value:.3f} (target {op} {target:g})")


def run(args: argparse.Namespace) -> int:
    sock = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    server = ctx.Process(target=serve, args=(sock, args.rate), daemon=True)
    server.start()
    sock.close()
    print(
        f"stream_overhead paced: {args.streams} streams x {args.rate:g} events/s x "
        f"{args.seconds:g} s, {args.rounds} rounds; aiohttp {aiohttp.__version__}, "
        f"openai {openai.__version__}"
    )
    try:
        report(asyncio.run(measure(args, f"http://127.0.0.1:{port}/v1", port)))
    finally:
        server.terminate()
        server.join()
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=40, help="concurrent streams (paced mode)")
    p.add_argument("--rate", type=float, default=100.0, help="events/s per stream (paced mode)")
    p.add_argument("--seconds", type=float, default=3.0, help="length of a stream (paced mode)")
