"""The test processes hand their children Ctrl-C as a terminal would (tests/conftest.py's
``pytest_configure``), even when the run itself was started with SIGINT ignored, as ``cmd &``
and nohup start it: without that, every test that Ctrl-C's the CLI fails or hangs there."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.harness.doc_blocks import ROOT

REAL_TIME = "a child process is started and waited for"

SHOW = "import signal; print(signal.getsignal(signal.SIGINT))"

# A process started with SIGINT ignored that then does what each test process does at start.
STARTED_IGNORING = f"""
import signal, subprocess, sys
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
from tests.conftest import pytest_configure
pytest_configure(None)
print(subprocess.run([sys.executable, "-c", {SHOW!r}], capture_output=True, text=True).stdout)
"""


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_child_of_this_process_gets_python_s_ctrl_c() -> None:
    shown = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, timeout=60)
    assert shown.stdout.strip() == "<built-in function default_int_handler>", shown


def test_a_run_started_with_sigint_ignored_does_not_pass_that_on() -> None:
    shown = subprocess.run(
        [sys.executable, "-c", STARTED_IGNORING],
        cwd=ROOT, capture_output=True, text=True, timeout=60, preexec_fn=_ignoring_sigint,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "<built-in function default_int_handler>", shown
    without = subprocess.run(
        [sys.executable, "-c", SHOW],
        capture_output=True, text=True, timeout=60, preexec_fn=_ignoring_sigint,
    )  # fmt: skip
    assert without.stdout.strip() == str(int(signal.SIG_IGN)), without  # what it guards against
