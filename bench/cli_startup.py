"""Whole-process wall time of `ai-lease --help`, against the bare interpreter, in one run.

    .venv/bin/python bench/cli_startup.py                          # 30 interleaved runs
    .venv/bin/python bench/cli_startup.py --baseline /tmp/old      # and an older checkout

Run from the repository root in the dev environment. Every variant is a fresh process timed
from spawn to exit (``subprocess.run``, output discarded), round by round in the same order,
so a slow patch of the machine hits each alike; the table shows min / median / max of the wall
time, and the median CPU time (user + system, from the children's rusage), which a busy machine
moves far less than the wall.

Variants:

- ``python -c pass``: the floor (the interpreter and ``site`` alone);
- ``python -c 'import click'``: the CLI framework alone;
- ``ai-lease --help`` and ``ai-lease submit --help``: the console script as installed here
  (an editable install adds its import finder, ~10-20 ms, that a wheel install does not);
- ``--help (-S, this tree)``: the console script's code with ``site`` off (``-S -P``) and
  this tree plus the venv's site-packages on ``PYTHONPATH``: about what a wheel install
  costs, and the same set-up as
- ``--help (-S, baseline)``: the same for ``--baseline DIR``, an older checkout, e.g.
  ``git archive main | tar -x -C /tmp/old``.

The target (issue 13): ``ai-lease --help`` under 0.25 s whole-process wall (median).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.25
# What the console script runs (see the `ai-lease` script pip writes).
ENTRY = "import sys; from ai_lease.cli.app import main; sys.exit(main())"
BARE = ["-S", "-P", "-c", ENTRY, "--help"]  # no site (no editable finder), no cwd on sys.path

Variant = tuple[str, list[str], dict[str, str] | None]


def variants(baseline: Path | None) -> list[Variant]:
    python = sys.executable
    script = Path(python).with_name("ai-lease")
    site = sysconfig.get_paths()["purelib"]

    def bare(tree: Path) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), site])}

    found: list[Variant] = [
        ("python -c pass", [python, "-c", "pass"], None),
        ("python -c 'import click'", [python, "-c", "import click"], None),
    ]
    if script.exists():
        found += [
            ("ai-lease --help", [str(script), "--help"], None),
            ("ai-lease submit --help", [str(script), "submit", "--help"], None),
        ]
    found.append(("--help (-S, this tree)", [python, *BARE], bare(ROOT)))
    if baseline is not None:
        found.append(("--help (-S, baseline)", [python, *BARE], bare(baseline)))
    return found


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once(argv: list[str], env: dict[str, str] | None) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv``, from spawn to exit."""
    cpu, started = _children_cpu(), time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started, _children_cpu() - cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=30, help="interleaved runs per variant")
    p.add_argument("--baseline", type=Path, help="an older checkout of the repository to compare")
    args = p.parse_args()
    if args.baseline is not None and not (args.baseline / "ai_lease" / "__init__.py").is_file():
        p.error(f"--baseline {args.baseline}: no ai_lease package there")
    chosen = variants(args.baseline)
    print(f"cli start-up: {args.runs} interleaved runs; Python {sys.version.split()[0]}")
    for _, argv, env in chosen:  # warm the page cache and .pyc files
        once(argv, env)
    times: dict[str, list[float]] = {name: [] for name, _, _ in chosen}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in chosen}
    for _ in range(args.runs):
        for name, argv, env in chosen:
            wall, cpu = once(argv, env)
            times[name].append(wall)
            cpus[name].append(cpu)
    floor = statistics.median(times["python -c pass"])
    print(f"\n{'variant':<28} {'min':>7} {'median':>7} {'max':>7} {'- floor':>8} {'CPU':>6}  (ms)")
    for name, taken in times.items():
        mid = statistics.median(taken)
        print(
            f"{name:<28} {1000 * min(taken):>7.0f} {1000 * mid:>7.0f} {1000 * max(taken):>7.0f} "
            f"{1000 * (mid - floor):>8.0f} {1000 * statistics.median(cpus[name]):>6.0f}"
        )
    print()
    for name, taken in times.items():
        slug = "_".join("".join(c if c.isalnum() else " " for c in name).split())
        print(f"RESULT {slug.lower()}_median_s {statistics.median(taken):.3f}")
        print(f"RESULT {slug.lower()}_cpu_median_s {statistics.median(cpus[name]):.3f}")
    if "--help (-S, baseline)" in times:
        ratio = statistics.median(times["--help (-S, baseline)"]) / statistics.median(
            times["--help (-S, this tree)"]
        )
        print(f"RESULT baseline_vs_this_tree {ratio:.2f}")
    judged = times.get("ai-lease --help", times["--help (-S, this tree)"])
    mid = statistics.median(judged)
    verdict = "ok" if mid < TARGET_S else "miss"
    print(f"VERDICT {verdict} ai-lease --help median {mid:.3f} s < {TARGET_S} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
