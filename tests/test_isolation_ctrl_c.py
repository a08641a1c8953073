"""A Ctrl-C while process isolation's fork server is still starting does not end it.

A Ctrl-C reaches the worker's whole process group, the fork server included, and
multiprocessing has its server ignore SIGINT only once it has imported its preload (a second
or more on a busy machine): a Ctrl-C soon after `ai-lease worker --isolation process` started
used to end the server with a KeyboardInterrupt traceback on the worker's stderr.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

REAL_TIME = "a real fork server process, signalled the instant it starts"

_SCRIPT = textwrap.dedent(
    """
    import multiprocessing, os, signal, time

    from ai_lease.run.isolation.pool import start_fork_server

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ai_lease.run.isolation.forkserver"])
    start_fork_server()
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as children:
        pids = [int(pid) for pid in children.read().split()]
    (server,) = [pid for pid in pids if b"forkserver" in open(f"/proc/{pid}/cmdline", "rb").read()]
    os.kill(server, signal.SIGINT)  # a Ctrl-C while the server starts and imports its preload
    time.sleep(2.0)
    assert os.waitpid(server, os.WNOHANG) == (0, 0), "the fork server ended"
    child = context.Process(target=time.sleep, args=(0,))
    child.start()
    child.join(60)
    print("child exit code", child.exitcode)
    """
)


def test_a_ctrl_c_while_the_fork_server_starts_leaves_it_serving() -> None:
    """SIGINT to the fork server the instant it is started: it goes on and forks a child,
    and prints no traceback."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "child exit code 0", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
