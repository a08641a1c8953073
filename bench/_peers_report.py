"""bench/peers.py's report: the table (medians), ``RESULT`` lines and one ``VERDICT`` per
target of issue 28 (targets 1 and 2)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["report"]

FIELDS = ("jobs_per_s", "worker_us", "server_us", "server_run_us", "commands", "commands_run")
FIELDS += ("round_trips",)


def med(samples: list[Any], field: str) -> float:
    return float(statistics.median(getattr(s, field) for s in samples))


def _medians(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {
        name: {f: med(samples, f) for f in FIELDS}
        for name, samples in results.items()
        if isinstance(samples, list) and samples
    }


def _table(results: dict[str, Any], m: dict[str, dict[str, float]]) -> None:
    print(
        f"\n{'system':<18} {'jobs/s':>7} {'worker us/job':>14} {'server us/job':>14} "
        f"{'(run only)':>10} {'cmds/job':>9} {'(run only)':>10}   jobs/s per round"
    )
    for name, samples in results.items():
        if isinstance(samples, str):
            print(f"{name:<18} {samples}")
            continue
        x = m[name]
        each = " / ".join(f"{s.jobs_per_s:.0f}" for s in samples)
        print(
            f"{name:<18} {x['jobs_per_s']:7.0f} {x['worker_us']:14.0f} {x['server_us']:14.0f} "
            f"{x['server_run_us']:10.0f} {x['commands']:9.2f} {x['commands_run']:10.2f}   {each}"
        )
    print(
        "(medians over rounds; server: redis-server, or the postmaster and its backends; "
        "cmds: every Redis command the server ran (inside scripts and MULTI included), or "
        "PostgreSQL top-level statements; the whole job "
        "is its enqueue and its run, 'run only' from resume to the last completion)"
    )
    for name, samples in results.items():
        if isinstance(samples, list) and samples:
            mid = sorted(samples, key=lambda s: s.commands)[len(samples) // 2]
            top = sorted(mid.per_command.items(), key=lambda kv: -kv[1])
            print(f"  {name} per job: " + ", ".join(f"{k} {v:.2f}" for k, v in top))


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _ratio(m: dict[str, dict[str, float]], a: str, b: str, field: str) -> float | None:
    if a in m and b in m and m[b][field]:
        return m[a][field] / m[b][field]
    return None


def _verdict(ok: bool | None, target: str, detail: str) -> None:
    if ok is None:
        print(f"VERDICT miss {target} (not measured: {detail})")
    else:
        print(f"VERDICT {'ok' if ok else 'miss'} {target} ({detail})")


def report(results: dict[str, Any]) -> None:
    m = _medians(results)
    _table(results, m)
    print()
    for name, x in m.items():
        for field in FIELDS:
            if field == "round_trips" and name != "ai_lease_redis":
                continue
            print(f"RESULT {name}_{field} {x[field]:.3f}")
    pairs = [
        ("ai_lease_redis", "saq"),
        ("ai_lease_redis", "arq"),
        ("ai_lease_postgres", "pgqueuer"),
    ]
    for a, b in pairs:
        for field in ("jobs_per_s", "worker_us", "server_us", "commands"):
            r = _ratio(m, a, b, field)
            if r is not None:
                print(f"RESULT {a}_vs_{b}_{field} {r:.3f}")
    speed = _ratio(m, "ai_lease_redis", "saq", "jobs_per_s")
    _verdict(None if speed is None else speed >= 1.0, "redis_jobs_per_s_ge_saq", _f(speed))
    cmds = m.get("ai_lease_redis", {}).get("commands")
    _verdict(None if cmds is None else cmds <= 20, "redis_commands_per_job_le_20", _f(cmds))
    server = _ratio(m, "ai_lease_redis", "saq", "server_us")
    _verdict(None if server is None else server <= 1.5, "redis_server_cpu_le_1.5x_saq", _f(server))
    worker = _ratio(m, "ai_lease_redis", "saq", "worker_us")
    _verdict(None if worker is None else worker <= 1.2, "worker_cpu_le_1.2x_saq", _f(worker))
    pg_speed = _ratio(m, "ai_lease_postgres", "pgqueuer", "jobs_per_s")
    pg_server = _ratio(m, "ai_lease_postgres", "pgqueuer", "server_us")
    both = None if pg_speed is None or pg_server is None else pg_speed >= 1 and pg_server <= 1.5
    _verdict(
        both,
        "postgres_jobs_per_s_ge_pgqueuer_and_server_cpu_le_1.5x",
        f"jobs/s ratio {_f(pg_speed)}, server CPU ratio {_f(pg_server)}",
    )
