"""A fleet under one ``[limits]`` slot against llama-cpp-python's real server (issue 29, the
first measurement): four `ai-lease worker` processes running eight jobs at once each, the
server with its default single slot that cuts a running stream when another request arrives,
and ``concurrency = 1`` for its base URL in the settings the workers share. No stream is
cut, every job is DONE on its first attempt with the server's own answer, and the fleet
finishes a job about as often as one caller calling the server directly in sequence
(0.87-1.19x its gap beside a CI run; asserted within 1.5x of the slower of that gap and the
fleet's own calls, see the test).

Throughput is compared as the median gap between consecutive finished answers: the fleet's
(each job's commit time) against the direct caller's (each answer read whole), the direct
caller measured just before and just after the fleet, so a busy machine slows both (the
median, so that a burst of another process's work during one gap does not decide)."""

from __future__ import annotations

import itertools
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

import ai_lease
from ai_lease.job import Job
from tests.realservers.direct import ask_stream, chat_body, stream_text
from tests.realservers.servers import MODEL, LlamaServer, cli_env

pytestmark = [pytest.mark.realserver, pytest.mark.timeout(600)]

PROMPT = "Tell me about the lighthouse"
TOKENS = 300  # long enough that streams would overlap and cut each other (as in test_llama_workers)
WORKERS, PER_WORKER = 4, 8
JOBS = WORKERS * PER_WORKER
WORKER_ARGS = ("--log-json", "-c", str(PER_WORKER))  # JSON: each slot_taken / _released timed
DIRECT = 6


def _direct(llama: LlamaServer) -> tuple[str, list[float]]:
    """One caller, in sequence, streaming as ai_lease does: the answer, and the gaps between
    finished answers."""
    url = f"{llama.base_url}/chat/completions"
    body = chat_body(PROMPT, temperature=0.0, max_tokens=TOKENS)
    answers, ended = set(), []
    for _ in range(DIRECT):
        answers.add(stream_text(ask_stream(url, body, timeout=120)).strip())
        ended.append(time.monotonic())
    assert len(answers) == 1, answers  # greedy: the same answer every time
    return answers.pop(), _gaps(ended)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(sorted(times))]


def _config(tmp_path: Path, llama: LlamaServer) -> Path:
    path = tmp_path / "ai-lease.toml"
    path.write_text(
        f'[store]\nurl = "sqlite:///{tmp_path / "s.db"}"\n\n'
        f'[provider]\nname = "openai-compatible"\nbase_url = "{llama.base_url}"\n'
        f'model = "{MODEL}"\n\n'
        f'[limits."{llama.base_url}"]\nconcurrency = 1\nmax_wait = 300\n',
        encoding="utf-8",
    )
    return path


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def _wait_all(client: ai_lease.SyncClient, keys: list[str], timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        records = [client.status(key) for key in keys]
        if all(r is not None and r.status.terminal for r in records):
            return records
        assert time.monotonic() < deadline, f"jobs not ended in {timeout} s: {records}"
        time.sleep(0.5)  # real: the workers run the jobs in real time


def test_four_workers_share_the_one_slot_without_cutting_a_stream(
    llama: LlamaServer, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    expected, before = _direct(llama)
    config = _config(tmp_path, llama)
    keys = [f"fleet-{n:02d}" for n in range(JOBS)]
    with ai_lease.SyncClient.connect(f"sqlite:///{tmp_path / 's.db'}") as client:
        for key in keys:
            client.submit(
                Job(
                    key, input=PROMPT, prompt_text="{{ input }}", temperature=0.0, max_tokens=TOKENS
                )
            )
        mark = llama.log_mark()
        cli = Path(sys.executable).with_name("ai-lease")
        for n in range(WORKERS):
            with (tmp_path / f"worker{n}.log").open("wb") as log:
                workers.append(
                    subprocess.Popen(
                        [str(cli), "--config", str(config), "worker", *WORKER_ARGS],
                        env=cli_env(),
                        cwd=tmp_path,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        records = _wait_all(client, keys, timeout=JOBS * max(before) * 3 + 120)
    answer, after = _direct(llama)
    assert answer == expected
    direct_gap = statistics.median(before + after)
    logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in tmp_path.glob("worker*.log"))
    failed = {r.key: r.last_error for r in records if r.status is not ai_lease.Status.DONE}
    assert not failed, f"{failed}\n{logs}"
    assert all(r.output == expected for r in records)
    assert [r.attempts for r in records] == [1] * JOBS  # nothing cut, so nothing called again
    cut = llama.text()[mark:].count("disconnected\n")
    assert cut == 0, f"{cut} streams cut under concurrency = 1:\n{llama.tail()}"
    fleet_gap = statistics.median(_gaps([r.updated_at for r in records]))
    held = statistics.median(_held(tmp_path.glob("worker*.log")))
    # The target, within 10 %, is asserted against the loopback server on every store
    # (tests/test_limits_fleet.py): there the server's pace does not depend on the CPU. Here
    # the model computes on the same two cores as the four workers and whatever else the
    # machine runs, so its own speed moves with the load (measured: 0.87-1.19x beside a CI
    # run, 1.04-1.31x with two busy loops too). The bound is what a fleet that loses its
    # hand-over would break: a missed wake-up costs a whole poll per call, 2x or more.
    # It is taken against the slower of the direct caller and the fleet's own calls (how long
    # each job held the slot, by the workers' slot_taken / slot_released events): when the
    # rest of the suite loads the machine more during the fleet than during the direct calls
    # before and after it, each call of the fleet's is slower too (measured once: 3.2x the
    # direct gap), and only the time between one call and the next is the fleet's to answer for.
    assert fleet_gap <= 1.5 * max(direct_gap, held), (
        f"the fleet finished a job every {fleet_gap:.3f}s, one caller every {direct_gap:.3f}s, "
        f"and each job held the slot for {held:.3f}s"
    )


def _held(logs: Iterable[Path]) -> list[float]:
    """How long each job held the slot: from its ``slot_taken`` to its ``slot_released``, in
    the workers' JSON logs (one line per event, ``ts`` to the millisecond)."""
    taken: dict[str, float] = {}
    held: list[float] = []
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("event") not in ("slot_taken", "slot_released"):
                continue
            at = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
            if event["event"] == "slot_taken":
                taken[event["key"]] = at
            elif event["key"] in taken:
                held.append(at - taken.pop(event["key"]))
    assert len(held) == JOBS, f"{len(held)} slot holds in the workers' logs, want {JOBS}"
    return held
