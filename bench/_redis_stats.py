"""What redis-server did between two points: ``INFO commandstats`` deltas.

A script's ``usec`` includes the commands it runs, which are counted apart as well: the
server's CPU is the sum over the commands clients *sent* (round trips), and the commands
run inside scripts are listed apart, to show where a script's time goes. Shared by
bench/coordination.py and bench/lease_ops.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["INNER", "Calls", "snapshot"]

# What the scripts run inside (ai_lease's lease and epoch scripts; the pair's): not sent by a
# client, so not round trips, and already inside their script's usec. HINCRBY and SADD are
# not here: the history's flush sends them (one pipelined round trip).
INNER = frozenset({"exists", "hget", "hgetall", "hmget", "hset", "publish", "time", "zadd"})
INNER |= {"zrem", "zrangebyscore", "get", "set", "incr", "pexpire", "del"}
INNER |= {"rpush", "lindex", "ltrim"}  # the job timeline's entry, written inside each script
INNER |= {"zscore", "zincrby"}  # the creation index and its counts (stores/redis/listing.py)
INNER |= {"hdel"}  # the checkpoint's removal, inside ACQUIRE / FINISH (stores/redis/scripts.py)
OWN = frozenset({"info", "config|resetstat"})  # the benchmark's own: never counted


@dataclass
class Calls:
    """Per command: calls and server µs (``usec``), summed over measured slices."""

    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, float] = field(default_factory=dict)

    def add(self, before: Calls, after: Calls) -> None:
        for name, n in after.calls.items():
            delta = n - before.calls.get(name, 0)
            if delta:
                self.calls[name] = self.calls.get(name, 0) + delta
                used = after.usec[name] - before.usec.get(name, 0.0)
                self.usec[name] = self.usec.get(name, 0.0) + used

    def sent(self) -> dict[str, int]:
        """The commands clients sent."""
        return {k: n for k, n in self.calls.items() if k not in INNER}

    def server_usec(self) -> float:
        """The server's time in the commands clients sent (their scripts' inner ones included)."""
        return sum(u for k, u in self.usec.items() if k not in INNER)

    def table(self, jobs: int) -> list[str]:
        """One line per command: calls per job, µs per call, µs per job."""
        lines = [f"    {'command':<14} {'calls/job':>9} {'µs/call':>8} {'µs/job':>8}"]
        for name in sorted(self.calls, key=lambda k: (k in INNER, -self.usec[k])):
            n, used = self.calls[name], self.usec[name]
            where = "  (inside scripts)" if name in INNER else ""
            lines.append(
                f"    {name:<14} {n / jobs:9.2f} {used / n:8.2f} {used / jobs:8.2f}{where}"
            )
        return lines


async def snapshot(admin: Any) -> Calls:
    """Every command's calls and usec so far (the bench's own INFO left out)."""
    info = await admin.info("commandstats")
    out = Calls()
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        if name in OWN:
            continue
        out.calls[name], out.usec[name] = int(value["calls"]), float(value["usec"])
    return out
