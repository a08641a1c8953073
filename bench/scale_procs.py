"""Many guarded streams over real HTTP from 1 and 2 worker processes: events/s per process count.

    .venv/bin/python bench/scale_procs.py                     # 2000 streams x 20 ev/s, procs 1,2
    .venv/bin/python bench/scale_procs.py --streams 1000 --procs 1,2 --rounds 3

One process guarding paced streams is CPU-bound at ~20k events/s on this machine
(bench/scale.py), so the way past that is more worker processes, one per core. This bench
offers ``--streams`` x ``--rate`` events/s (default 2,000 x 20 = 40,000, past one process),
split evenly over P client processes for each P in ``--procs``, and reports what they deliver.

The source is bench/scale.py's paced server (one chunked frame per write, every 1 / ``--rate``
s on an absolute schedule, each event stamped with its due and send time): ``--server-procs``
forked processes (default 2) accepting on one listening socket, so the server is not the
first limit. Each client process (forked, asyncio) reads its share of the streams with the
lean adapter on aiohttp (``OpenAICompatProvider``, one pool per process) under
``StreamGuard`` (as the call_ai stage runs it; ``--consumer raw`` reads them bare), the streams
starting within ``--ramp`` s of one common start time. The guard's budgets are generous
(first token 30 s, idle 30 s): this bench counts events, bench/scale.py judges deadlines.

Per P, interleaved round by round (``--rounds``; the order alternates), medians:

* events/s = the content events all P processes received / (the last stream's end - start);
  "of paced" = that over what consumers that keep pace receive (every event within
  ``--ramp`` + ``--seconds`` of the start: 33,333 events/s at the defaults);
* client CPU per event = the processes' CPU (``process_time``) / events; server CPU (/proc);
* event lateness p50 / p99 = delivered - sent (bench/_scale_late.py: one monotonic clock,
  ``CLOCK_MONOTONIC``, shared by the processes of one machine), pooled over the rounds;
* server send lag p99 = sent - due: a server behind its own schedule offers less.

It prints no target verdict (issue 28 asks only that the scaling be shown); ``RESULT
events_per_s_scaling`` is events/s at the largest P over events/s at the first.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _scale_late import StampedParts, lateness, summary
from scale import serve

from ai_lease import Progress, StreamGuard, StreamTimeouts
from ai_lease.providers.base import ChatRequest
from ai_lease.providers.openai_compat import OpenAICompatProvider

TIMEOUTS = StreamTimeouts(first_token=30, idle=30, total=600)


async def one_stream(
    provider: OpenAICompatProvider, chunks: int, guarded: bool, start_at: float, ramp: float
) -> StampedParts:
    """One stream from ``start_at`` + a random moment within ``ramp``: its stamped texts."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()) + random.uniform(0, ramp))
    parts = StampedParts()
    request = ChatRequest([{"role": "user", "content": "go"}], max_tokens=chunks)
    if guarded:
        guard = StreamGuard(TIMEOUTS, Progress())
        guard.text_parts = parts
        await guard.call(provider, request)
        return parts
    append = parts.append
    async for batch in provider.stream_batches(request):
        for delta in batch:
            if delta.text:
                append(delta.text)
    return parts


async def client(base_url: str, n: int, args: argparse.Namespace, start_at: float) -> dict:
    """``n`` streams in this process; its events, CPU and the moment the last one ended."""
    provider = OpenAICompatProvider(
        base_url=base_url, model="scale", max_connections=max(n, 1), pool_timeout=60.0
    )
    chunks, guarded = round(args.seconds * args.rate), args.consumer == "guarded"
    c0 = time.process_time()
    try:
        results = await asyncio.gather(
            *(one_stream(provider, chunks, guarded, start_at, args.ramp) for _ in range(n)),
            return_exceptions=True,
        )
        end = time.monotonic()
    finally:
        await provider.aclose()
    cpu = time.process_time() - c0
    parts = [r for r in results if isinstance(r, StampedParts)]
    errors = [f"{type(r).__name__}: {r}"[:200] for r in results if isinstance(r, BaseException)]
    late, lag = lateness(parts)
    return {
        "events": sum(len(p) for p in parts),
        "end": end,
        "cpu": cpu,
        "late": late,
        "lag": lag,
        "errors": errors,
    }


def client_process(base_url: str, n: int, args: argparse.Namespace, start_at: float, conn: Any):
    random.seed(os.getpid())
    try:
        conn.send(asyncio.run(client(base_url, n, args, start_at)))
    except BaseException as exc:  # reported to the parent, which says the variant failed
        conn.send({"failed": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def proc_cpu(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (/proc/<pid>/stat)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(base_url: str, procs: int, args: argparse.Namespace, servers: list[int]) -> dict:
    """One run at ``procs`` client processes, forked, all starting at one moment."""
    ctx = multiprocessing.get_context("fork")
    shares = [args.streams // procs + (i < args.streams % procs) for i in range(procs)]
    start_at = time.monotonic() + 0.5 + 0.1 * procs  # time for the forks to be ready
    s0 = proc_cpu(servers)
    pipes, children = [], []
    for n in shares:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=client_process, args=(base_url, n, args, start_at, child))
        p.start()
        child.close()
        pipes.append(parent)
        children.append(p)
    outs = [pipe.recv() for pipe in pipes]
    for p in children:
        p.join()
    server_cpu = proc_cpu(servers) - s0
    failed = [o["failed"] for o in outs if "failed" in o]
    if failed:
        return {"procs": procs, "failed": failed[0]}
    events = sum(o["events"] for o in outs)
    wall = max(o["end"] for o in outs) - start_at
    return {
        "procs": procs,
        "events": events,
        "wall": wall,
        "events_per_s": events / wall,
        "cpu_us_per_event": sum(o["cpu"] for o in outs) / max(events, 1) * 1e6,
        "cpu_per_proc": [o["cpu"] / wall for o in outs],
        "server_cpu": server_cpu / wall,
        "late": [x for o in outs for x in o["late"]],
        "lag": [x for o in outs for x in o["lag"]],
        "errors": [e for o in outs for e in o["errors"]],
    }


def report(args: argparse.Namespace, runs: dict[int, list[dict]]) -> None:
    """The table (medians over rounds; lateness pooled), RESULT lines, the errors seen."""
    offered = args.streams * args.rate
    # a consumer that keeps pace gets every event within ramp + seconds of the start
    paced = args.streams * round(args.seconds * args.rate) / (args.seconds + args.ramp)
    print(
        f"\n{'procs':>5} {'events/s':>9} {'of paced':>10} {'wall s':>7} "
        f"{'CPU us/ev':>9} {'CPU/proc':>15} {'server CPU':>10} {'late p50 ms':>11} "
        f"{'p99 ms':>8} {'send lag p99':>12}  events/s per round"
    )
    out: dict[str, float] = {}
    for procs, rs in runs.items():
        ok = [r for r in rs if "failed" not in r]
        for r in rs:
            if "failed" in r:
                print(f"{procs:5d} failed: {r['failed']}")
        if not ok:
            continue
        med = {
            k: statistics.median(r[k] for r in ok)
            for k in ("events_per_s", "wall", "cpu_us_per_event", "server_cpu")
        }
        per_proc = "/".join(
            f"{statistics.median(r['cpu_per_proc'][i] for r in ok):.0%}" for i in range(procs)
        )
        late = summary([x for r in ok for x in r["late"]])
        lag = summary([x for r in ok for x in r["lag"]])
        rounds = " ".join(f"{r['events_per_s']:.0f}" for r in ok)
        print(
            f"{procs:5d} {med['events_per_s']:9.0f} {med['events_per_s'] / paced:10.1%} "
            f"{med['wall']:7.2f} {med['cpu_us_per_event']:9.1f} {per_proc:>15} "
            f"{med['server_cpu']:10.0%} {late['p50']:11.1f} {late['p99']:8.1f} "
            f"{lag['p99']:12.1f}  {rounds}"
        )
        errors = [e for r in ok for e in r["errors"]]
        if errors:
            print(f"      {len(errors)} streams failed, e.g. {errors[0]}")
        out[f"events_per_s_{procs}proc"] = med["events_per_s"]
        out[f"cpu_us_per_event_{procs}proc"] = med["cpu_us_per_event"]
        out[f"event_lateness_p50_ms_{procs}proc"] = late["p50"]
        out[f"event_lateness_p99_ms_{procs}proc"] = late["p99"]
        out[f"server_send_lag_p99_ms_{procs}proc"] = lag["p99"]
        out[f"failed_streams_{procs}proc"] = len(errors)
    first, last = args.procs[0], args.procs[-1]
    if f"events_per_s_{first}proc" in out and f"events_per_s_{last}proc" in out:
        scaling = out[f"events_per_s_{last}proc"] / out[f"events_per_s_{first}proc"]
        out["events_per_s_scaling"] = scaling
        print(
            f"\nevents/s at {last} processes / at {first}: {scaling:.2f} "
            f"(offered {offered:,.0f} events/s once all run; kept pace: {paced:,.0f} over "
            f"ramp + seconds)"
        )
    print()
    for k, v in out.items():
        print(f"RESULT {k} {v:.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--streams", type=int, default=2000, help="streams in all, split over procs")
    p.add_argument("--rate", type=float, default=20.0, help="content events per second each")
    p.add_argument("--seconds", type=float, default=5.0, help="how long each stream runs")
    p.add_argument("--procs", default="1,2", help="client process counts (first: the base)")
    p.add_argument("--server-procs", type=int, default=2, help="paced server processes")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--ramp", type=float, default=1.0, help="streams start within this many s")
    p.add_argument("--consumer", choices=("guarded", "raw"), default="guarded")
    args = p.parse_args()
    args.procs = [int(x) for x in args.procs.split(",")]
    random.seed(8)
    sock = socket.create_server(("127.0.0.1", 0), backlog=8192)
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    ctx = multiprocessing.get_context("fork")
    servers = [
        ctx.Process(target=serve, args=(sock, args.rate), daemon=True)
        for _ in range(args.server_procs)
    ]
    for s in servers:
        s.start()
    sock.close()
    print(
        f"scale_procs: {args.streams} streams x {args.rate:g} events/s x {args.seconds:g} s "
        f"(offered {args.streams * args.rate:,.0f} events/s), client processes {args.procs}, "
        f"{args.server_procs} server processes, {args.rounds} interleaved rounds, consumer "
        f"{args.consumer}, ramp {args.ramp:g} s; {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; Python {sys.version.split()[0]}, {TIMEOUTS}"
    )
    runs: dict[int, list[dict]] = {n: [] for n in args.procs}
    try:
        for i in range(args.rounds):
            order = args.procs if i % 2 == 0 else args.procs[::-1]
            for n in order:
                runs[n].append(measure(base_url, n, args, [s.pid for s in servers if s.pid]))
    finally:
        for s in servers:
            s.terminate()
            s.join()
    report(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
