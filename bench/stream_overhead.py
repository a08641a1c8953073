"""Chunks per second through ai_lease's guarded stream against the same stream read raw.

    .venv/bin/python bench/stream_overhead.py               # 40000 chunks, 7 rounds, 2 framings
    .venv/bin/python bench/stream_overhead.py --chunks 50000 --rounds 7 --framing close
    .venv/bin/python bench/stream_overhead.py --only adapters    # the other lean adapters

A local OpenAI-compatible server runs in a child process (its CPU is not the client's) and
answers every POST with one pre-rendered event stream, written with one ``sendall``: a role
chunk, N ``chat.completion.chunk`` events with a few characters of ``delta.content`` each
(N = the request's ``max_tokens``), a finish chunk, a usage chunk and ``data: [DONE]``. The
client is the bottleneck: its wall time equals its CPU time. Two wire framings, each with
its own server, measured one after the other in the same run:

* ``chunked``: every event is its own HTTP/1.1 chunk, as uvicorn (vLLM), llama.cpp and
  Ollama send them. h11 then hands httpx one piece per event, whatever the TCP reads hold.
* ``close``: bare events, the body ends at FIN (``Connection: close``). httpx hands over
  64 KiB reads, so this isolates the SSE parse + JSON + guard from the HTTP layer.

Variants, interleaved round by round on one event loop (medians over ``--rounds``):

* ``a bare bytes``   httpx ``aiter_bytes()``, split events, count ``data:``, no JSON
* ``a bare fast``    the same over aiohttp (``iter_any()``; the name is kept for history);
  the faster of the two bare reads, round by round, is the floor
* ``b httpx-sse``    httpx-sse ``aiter_sse()`` + orjson + ``choices[0].delta.content``
* ``c compat raw``   ai_lease ``OpenAICompatProvider.stream_batches()`` consumed directly (text
  kept), the cheapest way to read it; ``http="auto"`` takes the aiohttp path here
* ``d compat guard`` the same under ``StreamGuard`` + ``Progress`` (what the call_ai stage runs)
* ``k compat delta`` ``OpenAICompatProvider.stream()``, one delta at a time, consumed directly
* ``e compat+sse``   ``i`` with its ``SSEFramer`` swapped for httpx-sse's decoders
* ``f sdk raw``      the official ``AsyncOpenAI`` stream iterated
* ``g sdk adapter``  ai_lease ``OpenAISDKProvider.stream()`` consumed directly (text kept)
* ``h sdk guard``    the same under ``StreamGuard`` + ``Progress``
* ``i httpx raw``    ``OpenAICompatProvider(http="httpx").stream_batches()`` consumed directly
* ``j httpx guard``  the same under ``StreamGuard`` + ``Progress``
* ``l lines guard``  ``d`` with aiohttp's ``readline()`` framing in place of ``SSEFramer``

SDK variants stream ``--sdk-chunks`` (default chunks / 10); every figure is per content chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import socket
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from typing import Any

import aiohttp
import httpx
import httpx_sse
import openai
import orjson
import stream_adapters  # bench/stream_adapters.py: the other lean adapters, side by side
import stream_paced  # bench/stream_paced.py, beside this file (on sys.path when run as a script)

import ai_lease.providers.openai_compat as compat
from ai_lease.lease.progress import Progress
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.openai_sdk import OpenAISDKProvider
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."]
GUARDED_TARGET, SDK_TARGET, FLOOR_TARGET = 0.95, 10.0, 3.0
TIMEOUTS = StreamTimeouts(first_token=60, idle=60, total=600)
SDK_VARIANTS = ("f sdk raw", "g sdk adapter", "h sdk guard")
Results = dict[str, dict[str, list[float]]]  # variant -> {"rate": [...], "cpu_us": [...]}

# -- the server (child process) -------------------------------------------------------------


def chunk_event(delta: dict[str, Any], finish: str | None, usage: Any = None) -> bytes:
    """One event shaped like OpenAI's (with include_usage: ``usage`` null until the end)."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1732867200,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0ba0d124f1",
        "choices": [] if usage else [choice],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def render(n: int, framing: str) -> bytes:
    """The whole HTTP response for a stream of ``n`` content chunks."""
    events = [chunk_event({"role": "assistant", "content": ""}, None)]
    events += [chunk_event({"content": WORDS[i % len(WORDS)]}, None) for i in range(n)]
    usage = {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": n + 9}
    events += [chunk_event({}, "stop"), chunk_event({}, None, usage), b"data: [DONE]\n\n"]
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    if framing == "close":
        return (head + "Connection: close\r\n\r\n").encode() + b"".join(events)
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + body + b"0\r\n\r\n"


def serve_connection(conn: socket.socket, framing: str, cache: dict[int, bytes]) -> None:
    """Answer requests on one connection: read head and body, send the pre-rendered stream."""
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            length = next((int(x[15:]) for x in lines if x.startswith(b"content-length:")), 0)
            while len(buf) < length:
                buf += conn.recv(65536)
            body, buf = buf[:length], buf[length:]
            n = int(json.loads(body).get("max_tokens") or 10)
            if n not in cache:
                cache[n] = render(n, framing)
            conn.sendall(cache[n])
            if framing == "close":
                conn.shutdown(socket.SHUT_WR)
                return


def serve(sock: socket.socket, framing: str) -> None:
    cache: dict[int, bytes] = {}
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=serve_connection, args=(conn, framing, cache), daemon=True).start()


# -- the variants (client process) ----------------------------------------------------------

Variant = Callable[[int], Awaitable[int]]  # streams n content chunks, returns how many it saw
MESSAGES = [{"role": "user", "content": "Count to a lot."}]


def request_json(n: int) -> dict[str, Any]:
    return {
        "model": "bench",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": n,
        "stream_options": {"include_usage": True},
    }


class HttpxSSEFramer:
    """Drop-in for ai_lease's ``SSEFramer`` built on httpx-sse's decoders (variant e), fed as
    ``aiter_sse()`` feeds them: bytes → text → lines → events."""

    def __init__(self, max_event_bytes: int = 0) -> None:
        self.text = httpx._decoders.TextDecoder()  # what Response.aiter_text() uses
        self.lines, self.events = (
            httpx_sse._decoders.SSELineDecoder(),
            httpx_sse._decoders.SSEDecoder(),
        )

    def feed(self, raw: bytes) -> list[bytes]:
        out = []
        for line in self.lines.decode(self.text.decode(raw)):
            if (event := self.events.decode(line.rstrip("\n"))) is not None:
                out.append(event.data.encode())
        return out

    def close(self) -> list[bytes]:
        return []


class HttpxSSEFramed(compat.OpenAICompatProvider):
    framer = HttpxSSEFramer  # type: ignore[assignment]


async def count_data_events(chunks: AsyncIterator[bytes]) -> int:
    """The floor: split the bytes into events and count the ``data:`` ones, no JSON.
    Returns the content chunks (all events but role, finish, usage and ``[DONE]``)."""
    events, buf = 0, b""
    async for raw in chunks:
        *parts, buf = (buf + raw).split(b"\n\n")
        events += sum(1 for p in parts if p.startswith(b"data:"))
    return events - 4


async def collect_raw(stream: AsyncIterator[Any]) -> int:
    """The raw consumer: keeps the answer's text, as any caller must; no guard, no progress."""
    parts = [delta.text async for delta in stream if delta.text]
    return len(parts) if "".join(parts) else 0


async def collect_raw_batches(stream: AsyncIterator[Any]) -> int:
    """The raw consumer of a batch stream: the same, one network read's deltas at a time."""
    parts = [delta.text async for batch in stream for delta in batch if delta.text]
    return len(parts) if "".join(parts) else 0


async def collect_guarded(provider: Any, request: ChatRequest) -> int:
    """What the call_ai stage runs: the guard, by batches where the provider offers them."""
    return (await StreamGuard(TIMEOUTS, Progress()).call(provider, request)).chunks


def make_variants(base_url: str) -> tuple[dict[str, Variant], list[Any]]:
    client = httpx.AsyncClient(timeout=60)
    fast_client = aiohttp.ClientSession()
    lean = compat.OpenAICompatProvider(base_url=base_url, model="bench")
    assert lean.http == "aiohttp", lean
    lean_httpx = compat.OpenAICompatProvider(base_url=base_url, model="bench", http="httpx")
    with_sse = HttpxSSEFramed(base_url=base_url, model="bench", http="httpx")
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    adapter = OpenAISDKProvider(base_url=base_url, api_key="x", model="bench")
    lines = stream_paced.LineFramed(base_url=base_url, model="bench")
    url = base_url + "/chat/completions"

    def req(n: int) -> ChatRequest:
        return ChatRequest(messages=MESSAGES, max_tokens=n)

    async def bare(n: int) -> int:
        async with client.stream("POST", url, json=request_json(n)) as response:
            return await count_data_events(response.aiter_bytes())

    async def bare_fast(n: int) -> int:
        body = orjson.dumps(request_json(n))
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        async with fast_client.post(url, data=body, headers=headers) as response:
            return await count_data_events(response.content.iter_any())

    async def httpx_sse_raw(n: int) -> int:
        seen = 0
        async with httpx_sse.aconnect_sse(client, "POST", url, json=request_json(n)) as source:
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                choices = orjson.loads(event.data)["choices"]
                seen += bool(choices and choices[0]["delta"].get("content"))
        return seen

    async def sdk_raw(n: int) -> int:
        stream: Any = await sdk.chat.completions.create(**request_json(n))
        parts = [c.choices[0].delta.content async for c in stream if c.choices]
        return sum(1 for p in parts if p)

    variants: dict[str, Variant] = {
        "a bare bytes": bare,
        "a bare fast": bare_fast,
        "b httpx-sse": httpx_sse_raw,
        "c compat raw": lambda n: collect_raw_batches(lean.stream_batches(req(n))),
        "d compat guard": lambda n: collect_guarded(lean, req(n)),
        "e compat+sse": lambda n: collect_raw_batches(with_sse.stream_batches(req(n))),
        "f sdk raw": sdk_raw,
        "g sdk adapter": lambda n: collect_raw(adapter.stream(req(n))),
        "h sdk guard": lambda n: collect_guarded(adapter, req(n)),
        "i httpx raw": lambda n: collect_raw_batches(lean_httpx.stream_batches(req(n))),
        "j httpx guard": lambda n: collect_guarded(lean_httpx, req(n)),
        "k compat delta": lambda n: collect_raw(lean.stream(req(n))),
        "l lines guard": lambda n: collect_guarded(lines, req(n)),
    }
    closers = [client.aclose, fast_client.close, lean.aclose, lean_httpx.aclose, with_sse.aclose]
    return variants, [*closers, lines.aclose, sdk.close, adapter.aclose]


async def measure(args: argparse.Namespace, base_url: str) -> Results:
    variants, closers = make_variants(base_url)
    res: Results = {name: {"rate": [], "cpu_us": []} for name in variants}
    try:
        for fn in variants.values():  # warm up: connections, imports, caches
            await fn(200)
        for _ in range(args.rounds):
            for name, fn in variants.items():
                n = args.sdk_chunks if name in SDK_VARIANTS else args.chunks
                gc.collect()  # every variant starts from the same heap; no collection mid-run
                gc.disable()
                t0, c0 = time.perf_counter(), time.process_time()
                seen = await fn(n)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                gc.enable()
                if seen != n:
                    raise RuntimeError(f"bench: {name} saw {seen} content chunks, expected {n}")
                res[name]["rate"].append(n / wall)
                res[name]["cpu_us"].append(cpu / n * 1e6)
    finally:
        for close in closers:
            await close()
    return res


def run_framing(args: argparse.Namespace, framing: str) -> Results:
    """Start a server for ``framing`` in a child process, measure every variant against it."""
    sock = socket.create_server(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    ctx = multiprocessing.get_context("fork")  # inherits the listening socket: no start race
    server = ctx.Process(target=serve, args=(sock, framing), daemon=True)
    server.start()
    sock.close()
    try:
        return asyncio.run(measure(args, base_url))
    finally:
        server.terminate()
        server.join()


# -- the report -----------------------------------------------------------------------------


def report(framing: str, res: Results, args: argparse.Namespace) -> list[tuple[bool, str]]:
    med = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in res.items()}

    def ratio(a: str, b: str, key: str = "rate") -> float:  # median of per-round ratios
        return statistics.median(x / y for x, y in zip(res[a][key], res[b][key], strict=True))

    # The floor: the faster bare read of each round (the least CPU per chunk).
    res["floor"] = {
        k: [min(x, y) if k == "cpu_us" else max(x, y) for x, y in zip(*pair, strict=True)]
        for k in ("rate", "cpu_us")
        for pair in [(res["a bare bytes"][k], res["a bare fast"][k])]
    }

    print(f"\n[{framing}] {'variant':<15} {'chunks':>7} {'chunks/s':>10} {'wall µs':>8} CPU µs")
    for name, m in med.items():
        n = args.sdk_chunks if name in SDK_VARIANTS else args.chunks
        cells = f"{n:>7} {m['rate']:>10.0f} {1e6 / m['rate']:>8.2f} {m['cpu_us']:>6.2f}"
        print(f"[{framing}] {name:<15} {cells}")

    out: dict[str, float] = {}
    for name, m in med.items():
        key = name[2:].replace(" ", "_").replace("-", "_").replace("+", "_")
        out[f"{key}_chunks_per_s"] = m["rate"]
        out[f"{key}_cpu_us_per_chunk"] = m["cpu_us"]
    out |= {
        "ratio_compat_guarded_vs_raw": ratio("d compat guard", "c compat raw"),
        "ratio_httpx_guarded_vs_raw": ratio("j httpx guard", "i httpx raw"),
        "ratio_sdk_guarded_vs_raw": ratio("h sdk guard", "g sdk adapter"),
        "ratio_compat_guarded_vs_sdk_raw": ratio("d compat guard", "f sdk raw"),
        "ratio_httpx_guarded_vs_sdk_raw": ratio("j httpx guard", "f sdk raw"),
        "ratio_compat_raw_vs_httpx_raw": ratio("c compat raw", "i httpx raw"),
        "ratio_cpu_compat_guarded_vs_floor": ratio("d compat guard", "floor", "cpu_us"),
        "ratio_cpu_compat_raw_vs_floor": ratio("c compat raw", "floor", "cpu_us"),
        "ratio_compat_httpx_sse_vs_own_parser": ratio("e compat+sse", "i httpx raw"),
        "ratio_httpx_sse_bare_vs_compat_raw": ratio("b httpx-sse", "i httpx raw"),
        "ratio_cpu_lines_guard_vs_compat_guard": ratio("l lines guard", "d compat guard", "cpu_us"),
    }
    print()
    for k, v in out.items():
        print(
            f"RESULT {framing}_{k} {v:.0f}" if k.endswith("_s") else f"RESULT {framing}_{k} {v:.3f}"
        )

    targets = [  # (result, comparison, target)
        ("ratio_compat_guarded_vs_raw", ">=", GUARDED_TARGET),
        ("ratio_httpx_guarded_vs_raw", ">=", GUARDED_TARGET),
        ("ratio_sdk_guarded_vs_raw", ">=", GUARDED_TARGET),
        ("ratio_compat_guarded_vs_sdk_raw", ">=", SDK_TARGET),
    ]
    # The CPU floor is judged on the framing servers send. Over ``close`` framing a bare
    # read is a memcpy of 64 KiB blocks (~0.5 µs per event), less than decoding the
    # event's JSON alone (~0.75 µs): no parser that validates what it hands on can come
    # within 3x of it, so there the ratio is shown, not judged (docs/benchmarks.md).
    if framing == "chunked":
        targets.append(("ratio_cpu_compat_guarded_vs_floor", "<=", FLOOR_TARGET))
    else:
        print(f"INFO {framing}_cpu_compat_guarded_vs_floor is a diagnostic here, not a target")
    return [
        (out[k] >= t if op == ">=" else out[k] <= t, f"{framing}_{k[6:]}{op}{t:g} ({out[k]:.3f})")
        for k, op, t in targets
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--chunks", type=int, default=40000, help="content chunks per stream")
    p.add_argument("--sdk-chunks", type=int, help="content chunks per SDK stream (chunks / 10)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians reported)")
    p.add_argument("--framing", choices=("both", "chunked", "close"), default="both")
    p.add_argument("--mode", choices=("burst", "paced"), default="burst")
    p.add_argument(
        "--only",
        choices=("all", "openai", "adapters"),
        default="all",
        help="the OpenAI-format variants, the other adapters (bench/stream_adapters.py), or both",
    )
    stream_paced.add_arguments(p)
    args = p.parse_args()
    if args.mode == "paced":
        return stream_paced.run(args)
    args.sdk_chunks = args.sdk_chunks or max(1, args.chunks // 10)
    framings = ("chunked", "close") if args.framing == "both" else (args.framing,)
    print(
        f"stream_overhead: {args.chunks} chunks ({args.sdk_chunks} for the SDK) x {args.rounds} "
        f"rounds, framing {'+'.join(framings)}; Python {sys.version.split()[0]}, "
        f"httpx {httpx.__version__}, httpx-sse {version('httpx-sse')}, "
        f"openai {openai.__version__}, orjson {orjson.__version__}"
    )
    verdicts = []
    if args.only in ("all", "openai"):
        verdicts += [
            v for framing in framings for v in report(framing, run_framing(args, framing), args)
        ]
    if args.only in ("all", "adapters"):
        verdicts += stream_adapters.run(args)
    print()
    for ok, text in verdicts:
        print(f"VERDICT {'ok' if ok else 'miss'} {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
