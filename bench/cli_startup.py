"""Whole-process wall time of `ai-lease --help` and `ai-lease ls`, against the bare
interpreter, in one run.

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
  ``git archive main | tar -x -C /tmp/old``;
- ``ai-lease ls``: the console script listing a real SQLite store (``--jobs`` jobs, 200 by
  default, submitted beforehand with this tree into a temporary directory, which every
  variant runs in; no settings file there, so the store, the lease and everything else are
  at their defaults), its 50 newest jobs printed as the table;
- ``ls (-S, this tree)`` and ``ls (-S, baseline)``: the same listing with ``site`` off, as
  for ``--help``.

The targets (issue 28): ``ai-lease ls``, ``ai-lease --help`` and ``ai-lease submit --help``
each at most 0.2 s whole-process wall (median).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 0.2
JUDGED = ("ai-lease --help", "ai-lease submit --help", "ai-lease ls")
# What the console script runs (see the `ai-lease` script pip writes).
ENTRY = "import sys; from ai_lease.cli.app import main; sys.exit(main())"
BARE = ["-S", "-P", "-c", ENTRY]  # no site (no editable finder), no cwd on sys.path
# Submits argv[1] jobs (recorded for workers, none run) into the default store of the cwd.
FILL = """
import asyncio, sys
from ai_lease import Job, connect

async def fill(count):
    async with connect("sqlite:///.ai-lease/ai-lease.db", provider=None) as client:
        for n in range(count):
            job = Job(f"job-{n:05d}", input="some text " * 20, prompt_text="{{ input }}")
            await client.submit(job)

asyncio.run(fill(int(sys.argv[1])))
"""

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
            ("ai-lease ls", [str(script), "ls"], None),
        ]
    found.append(("--help (-S, this tree)", [python, *BARE, "--help"], bare(ROOT)))
    if baseline is not None:
        found.append(("--help (-S, baseline)", [python, *BARE, "--help"], bare(baseline)))
    found.append(("ls (-S, this tree)", [python, *BARE, "ls"], bare(ROOT)))
    if baseline is not None:
        found.append(("ls (-S, baseline)", [python, *BARE, "ls"], bare(baseline)))
    return found


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def once(argv: list[str], env: dict[str, str] | None, cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` in ``cwd``, from spawn to exit."""
    cpu, started = _children_cpu(), time.perf_counter()
    subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    return time.perf_counter() - started, _children_cpu() - cpu


def fill_store(where: Path, jobs: int) -> None:
    """A SQLite store of ``jobs`` pending jobs in ``where``/.ai-lease/, made with this tree."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", FILL, str(jobs)], cwd=where, env=env, check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=int, default=30, help="interleaved runs per variant")
    p.add_argument("--baseline", type=Path, help="an older checkout of the repository to compare")
    p.add_argument("--jobs", type=int, default=200, help="jobs in the store `ls` lists")
    args = p.parse_args()
    if args.baseline is not None and not (args.baseline / "ai_lease" / "__init__.py").is_file():
        p.error(f"--baseline {args.baseline}: no ai_lease package there")
    if args.baseline is not None:
        args.baseline = args.baseline.resolve()
    chosen = variants(args.baseline)
    print(
        f"cli start-up: {args.runs} interleaved runs; `ls` over {args.jobs} jobs in SQLite; "
        f"Python {sys.version.split()[0]}"
    )
    with tempfile.TemporaryDirectory(prefix="cli-startup-") as tmp:
        fill_store(Path(tmp), args.jobs)
        times, cpus = measure(chosen, args.runs, Path(tmp))
    report(times, cpus)
    return 0


def measure(
    chosen: list[Variant], runs: int, cwd: Path
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds of each variant, ``runs`` times, round by round."""
    for _, argv, env in chosen:  # warm the page cache and .pyc files
        once(argv, env, cwd)
    times: dict[str, list[float]] = {name: [] for name, _, _ in chosen}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in chosen}
    for _ in range(runs):
        for name, argv, env in chosen:
            wall, cpu = once(argv, env, cwd)
            times[name].append(wall)
            cpus[name].append(cpu)
    return times, cpus


def report(times: dict[str, list[float]], cpus: dict[str, list[float]]) -> None:
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
    for what in ("--help", "ls"):
        if f"{what} (-S, baseline)" in times:
            ratio = statistics.median(times[f"{what} (-S, baseline)"]) / statistics.median(
                times[f"{what} (-S, this tree)"]
            )
            print(f"RESULT {what.strip('-')}_baseline_vs_this_tree {ratio:.2f}")
    for name in JUDGED:
        bare = "ls (-S, this tree)" if name == "ai-lease ls" else "--help (-S, this tree)"
        mid = statistics.median(times.get(name, times[bare]))
        verdict = "ok" if mid <= TARGET_S else "miss"
        print(f"VERDICT {verdict} {name} median {mid:.3f} s <= {TARGET_S} s")


if __name__ == "__main__":
    sys.exit(main())
