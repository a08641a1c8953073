"""Every lean adapter's stream against a bare bytes read of the same stream, side by side.

    .venv/bin/python bench/stream_overhead.py --only adapters --chunks 20000 --rounds 5

Part of ``bench/stream_overhead.py`` (run by it after the OpenAI variants). A local server in
a child process answers each adapter's endpoint with one pre-rendered stream in that
provider's wire shape — N text events (N = the request's token limit), with the format's
own preamble, keep-alives and end marker — every event its own HTTP/1.1 chunk, as the
providers send them. Per adapter, interleaved round by round (medians over ``--rounds``):

* ``floor``  aiohttp ``iter_any()`` of the same body, events split and counted, no JSON
* ``raw``    the adapter's ``stream_batches()`` consumed directly (text kept)
* ``guard``  the same under ``StreamGuard`` + ``Progress`` (what the call_ai stage runs)

Targets per adapter: guard / raw ≥ 0.95 (chunks per second), and guard CPU per text event
≤ 3× the floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from ai_lease.lease.progress import Progress
from ai_lease.providers.anthropic import AnthropicProvider
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.gemini import GeminiProvider
from ai_lease.providers.ollama import OllamaProvider
from ai_lease.providers.openai_responses import OpenAIResponsesProvider
from ai_lease.run.stream_guard import StreamGuard
from ai_lease.timeouts import StreamTimeouts

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."]
GUARDED_TARGET, FLOOR_TARGET = 0.95, 3.0
TIMEOUTS = StreamTimeouts(first_token=60, idle=60, total=600)

# -- the wire shapes, from each provider's published streaming documentation --------------


def _named(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def anthropic_events(n: int) -> list[bytes]:
    usage = {"input_tokens": 9, "output_tokens": 1}
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "content": []}
    events = [
        _named("message_start", {"message": {**message, "model": "claude", "usage": usage}}),
        _named("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _named("ping", {}),
    ]
    events += [
        _named(
            "content_block_delta",
            {"index": 0, "delta": {"type": "text_delta", "text": WORDS[i % len(WORDS)]}},
        )
        for i in range(n)
    ]
    end = {"delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    return [
        *events,
        _named("content_block_stop", {"index": 0}),
        _named("message_delta", {**end, "usage": {"output_tokens": n}}),
        _named("message_stop", {}),
    ]


def gemini_events(n: int) -> list[bytes]:
    def one(text: str, last: bool) -> bytes:
        candidate: dict[str, Any] = {"content": {"parts": [{"text": text}], "role": "model"}}
        if last:
            candidate["finishReason"] = "STOP"
        usage = {"promptTokenCount": 9, "candidatesTokenCount": n, "totalTokenCount": n + 9}
        body = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini"}
        return b"data: " + orjson.dumps(body) + b"\r\n\r\n"  # Gemini ends lines with CRLF

    return [one(WORDS[i % len(WORDS)], i == n - 1) for i in range(n)]


def ollama_events(n: int) -> list[bytes]:
    def line(body: dict[str, Any]) -> bytes:
        return orjson.dumps({"model": "llama3.2", "created_at": "2026-12-01T00:00:00Z", **body})

    events = [
        line({"message": {"role": "assistant", "content": WORDS[i % len(WORDS)]}, "done": False})
        + b"\n"
        for i in range(n)
    ]
    done = {"done": True, "done_reason": "stop", "prompt_eval_count": 9, "eval_count": n}
    return [*events, line({"message": {"role": "assistant", "content": ""}, **done}) + b"\n"]


def responses_events(n: int) -> list[bytes]:
    seq = iter(range(1_000_000_000))
    response = {"id": "resp_bench", "object": "response", "status": "in_progress", "output": []}

    def ev(kind: str, **data: Any) -> bytes:
        return _named(kind, {**data, "sequence_number": next(seq)})

    item = {"id": "msg_bench", "type": "message", "role": "assistant", "content": []}
    events = [
        ev("response.created", response=response),
        ev("response.in_progress", response=response),
        ev("response.output_item.added", output_index=0, item=item),
        ev("response.content_part.added", item_id="msg_bench", output_index=0, content_index=0),
    ]
    where = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    events += [
        ev("response.output_text.delta", **where, delta=WORDS[i % len(WORDS)], logprobs=[])
        for i in range(n)
    ]
    usage = {"input_tokens": 9, "output_tokens": n, "total_tokens": n + 9}
    done = {**response, "status": "completed", "usage": usage}
    return [*events, ev("response.completed", response=done)]


FORMATS: dict[str, tuple[Callable[[int], list[bytes]], bytes]] = {
    # path prefix → (the events of a stream of n text chunks, its content type)
    "/v1/messages": (anthropic_events, b"text/event-stream"),
    "/v1beta/models": (gemini_events, b"text/event-stream"),
    "/api/chat": (ollama_events, b"application/x-ndjson"),
    "/v1/responses": (responses_events, b"text/event-stream"),
}


def token_limit(path: str, body: dict[str, Any]) -> int:
    if path.startswith("/v1beta"):
        return int(body["generationConfig"]["maxOutputTokens"])
    if path.startswith("/api/chat"):
        return int(body["options"]["num_predict"])
    return int(body.get("max_output_tokens") or body.get("max_tokens") or 10)


def render(path: str, n: int) -> bytes:
    events_of, kind = next(v for k, v in FORMATS.items() if path.startswith(k))
    events = events_of(n)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def serve_connection(conn: socket.socket, cache: dict[tuple[str, int], bytes]) -> None:
    buf = b""
    with conn:
        while True:
            while b"\r\n\r\n" not in buf:
                if not (data := conn.recv(65536)):
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            path = lines[0].split(b" ")[1].decode()
            length = next((int(x[15:]) for x in lines if x.startswith(b"content-length:")), 0)
            while len(buf) < length:
                buf += conn.recv(65536)
            body, buf = buf[:length], buf[length:]
            n = token_limit(path, orjson.loads(body))
            if (path, n) not in cache:
                cache[path, n] = render(path, n)
            conn.sendall(cache[path, n])


def serve(sock: socket.socket) -> None:
    cache: dict[tuple[str, int], bytes] = {}
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=serve_connection, args=(conn, cache), daemon=True).start()


# -- the client ------------------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Count to a lot."}]


def adapters(base: str) -> dict[str, tuple[Any, str, bytes]]:
    """name → (provider, URL its stream is read from, the event separator)."""
    key = {"api_key": "bench-key", "model": "bench", "max_connections": 10}
    return {
        "anthropic": (
            AnthropicProvider(base_url=base, **key),
            base + "/v1/messages",
            b"\n\n",
        ),
        "gemini": (
            GeminiProvider(base_url=base + "/v1beta", **key),
            base + "/v1beta/models/bench:streamGenerateContent?alt=sse",
            b"\r\n\r\n",
        ),
        "ollama": (OllamaProvider(base_url=base, **key), base + "/api/chat", b"\n"),
        "responses": (
            OpenAIResponsesProvider(base_url=base + "/v1", **key),
            base + "/v1/responses",
            b"\n\n",
        ),
    }


def floor_body(name: str, n: int) -> dict[str, Any]:
    """A body the bench server reads ``n`` from (the floor sends no real request)."""
    if name == "gemini":
        return {"generationConfig": {"maxOutputTokens": n}}
    if name == "ollama":
        return {"options": {"num_predict": n}}
    return {"max_tokens": n, "max_output_tokens": n}


async def count_events(chunks: AsyncIterator[bytes], sep: bytes) -> int:
    events, buf = 0, b""
    async for raw in chunks:
        *parts, buf = (buf + raw).split(sep)
        events += len(parts)
    return events


async def raw_text(provider: Any, request: ChatRequest) -> int:
    parts = [d.text async for batch in provider.stream_batches(request) for d in batch if d.text]
    return len(parts) if "".join(parts) else 0


async def guarded(provider: Any, request: ChatRequest) -> int:
    return (await StreamGuard(TIMEOUTS, Progress()).call(provider, request)).chunks


async def measure(args: argparse.Namespace, base: str) -> dict[str, dict[str, list[float]]]:
    session = aiohttp.ClientSession()
    made = adapters(base)
    n = args.chunks

    def variants() -> dict[str, Callable[[int], Any]]:
        out: dict[str, Callable[[int], Any]] = {}
        for name, (provider, url, sep) in made.items():

            async def floor(k: int, url: str = url, sep: bytes = sep, name: str = name) -> int:
                body = orjson.dumps(floor_body(name, k))
                async with session.post(url, data=body) as response:
                    return await count_events(response.content.iter_any(), sep)

            out[f"{name} floor"] = floor
            out[f"{name} raw"] = lambda k, p=provider: raw_text(
                p, ChatRequest(MESSAGES, None, None, k)
            )
            out[f"{name} guard"] = lambda k, p=provider: guarded(
                p, ChatRequest(MESSAGES, None, None, k)
            )
        return out

    runs = variants()
    res = {name: {"rate": [], "cpu_us": []} for name in runs}
    try:
        for fn in runs.values():
            await fn(200)
        for _ in range(args.rounds):
            for name, fn in runs.items():
                gc.collect()
                gc.disable()
                t0, c0 = time.perf_counter(), time.process_time()
                seen = await fn(n)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                gc.enable()
                if not name.endswith("floor") and seen != n:
                    raise RuntimeError(f"bench: {name} saw {seen} text chunks, expected {n}")
                res[name]["rate"].append(n / wall)
                res[name]["cpu_us"].append(cpu / n * 1e6)
    finally:
        await session.close()
        for provider, _, _ in made.values():
            await provider.aclose()
    return res


def run(args: argparse.Namespace) -> list[tuple[bool, str]]:
    """Measure every adapter against its own server stream; the verdicts."""
    sock = socket.create_server(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = multiprocessing.get_context("fork").Process(target=serve, args=(sock,), daemon=True)
    server.start()
    sock.close()
    try:
        res = asyncio.run(measure(args, base))
    finally:
        server.terminate()
        server.join()
    return report(res, args)


def report(
    res: dict[str, dict[str, list[float]]], args: argparse.Namespace
) -> list[tuple[bool, str]]:
    def ratio(a: str, b: str, key: str) -> float:
        return statistics.median(x / y for x, y in zip(res[a][key], res[b][key], strict=True))

    print(f"\n[adapters] {'variant':<17} {'chunks':>7} {'chunks/s':>10} {'wall µs':>8} CPU µs")
    for name, r in res.items():
        rate, cpu = statistics.median(r["rate"]), statistics.median(r["cpu_us"])
        print(
            f"[adapters] {name:<17} {args.chunks:>7} {rate:>10.0f} {1e6 / rate:>8.2f} {cpu:>6.2f}"
        )
    verdicts = []
    print()
    for name in sorted({k.split()[0] for k in res}):
        guard_raw = ratio(f"{name} guard", f"{name} raw", "rate")
        cpu_floor = ratio(f"{name} guard", f"{name} floor", "cpu_us")
        print(f"RESULT adapters_{name}_guarded_vs_raw {guard_raw:.3f}")
        print(f"RESULT adapters_{name}_cpu_guard_vs_floor {cpu_floor:.3f}")
        verdicts += [
            (
                guard_raw >= GUARDED_TARGET,
                f"adapters_{name}_guarded_vs_raw>={GUARDED_TARGET:g} ({guard_raw:.3f})",
            ),
            (
                cpu_floor <= FLOOR_TARGET,
                f"adapters_{name}_cpu_guard_vs_floor<={FLOOR_TARGET:g} ({cpu_floor:.3f})",
            ),
        ]
    return verdicts
