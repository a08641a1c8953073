"""The benches' PostgreSQL: a cluster of their own, and what it did between two points.

The cluster is tests/harness/pg_server.py's (initdb + pg_ctl on a free port, as the
unprivileged user under root), started with ``pg_stat_statements`` so the statements
clients sent can be counted the way ``INFO commandstats`` counts Redis commands: every
store operation is one top-level statement in autocommit (one round trip), so the
statements per job are the round trips per job. ``track = top``: what a plpgsql lease
function runs inside is not a round trip and is not counted. A statement's ``usec`` is its
``total_exec_time``. fsync is on unless ``--pg-fsync off`` (the harness' test default) is
asked for: the figures are for a durable commit. Shared by bench/coordination.py and
bench/workers.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from _redis_stats import Calls

from tests.harness.pg_server import PostgresServer

__all__ = ["cluster", "server_cpu_s", "snapshot"]

_SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "pg_stat_statements.track": "top",
    "pg_stat_statements.max": "5000",
}
_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux
_OP = re.compile(r"\b(?:ail_(\w+)|(pair_\w+))\(")


def cluster(fsync: bool = True) -> PostgresServer:
    """A started cluster with pg_stat_statements; ``close()`` it when done."""
    server = PostgresServer(fsync=fsync, settings=_SETTINGS)
    server.start()
    server.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return server


def _name(query: str) -> str:
    """A statement's short name: its ``ail_<op>`` function (``<op>``), the hand-rolled pair's
    ``pair_<op>`` function (bench/_pg_pair.py), else its first word."""
    found = _OP.search(query)
    if found is not None:
        return found.group(1) or found.group(2)
    return query.split(None, 1)[0].lower() if query.strip() else "?"


def snapshot(server: PostgresServer) -> Calls:
    """Every client statement's calls and µs so far, by name (this query left out)."""
    rows = server.execute(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND query NOT LIKE '%pg_stat_statements%'"
    )
    out = Calls()
    for query, calls, exec_ms in rows:
        name = _name(query)
        out.calls[name] = out.calls.get(name, 0) + int(calls)
        out.usec[name] = out.usec.get(name, 0.0) + float(exec_ms) * 1000
    return out


def server_cpu_s(server: PostgresServer) -> float:
    """User + system CPU seconds of the postmaster and every backend alive now."""
    pids = [server.pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == server.pid:
            pids.append(int(stat.parent.name))
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICKS
