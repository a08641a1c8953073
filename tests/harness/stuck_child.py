"""A child process that gets stuck on purpose, for the termination ladder's tests.

    python -m tests.harness.stuck_child MODE WORKDIR [--ignore-term]

MODE is ``sleep`` (a thread stuck in ``time.sleep``), ``recv`` (the main thread in a
blocking ``socket.recv`` with no timeout), ``busy`` (the main thread in a tight pure-Python
loop, holding the GIL), ``cloop`` (one endless C call, ``sum`` over ``itertools.repeat``,
that never lets a Python signal handler run) or ``await`` (a coroutine awaiting forever on
a live event loop). Before getting stuck the child opens two files and a socket pair,
writes a temp file ``WORKDIR/temp.txt`` (its "registered" cleanup), installs the ladder's
handlers (dump file ``WORKDIR/dump.txt``) and then creates ``WORKDIR/ready``.
Its ``on_terminate`` hook writes ``WORKDIR/terminated``, removes the temp file and exits 0.
With ``--ignore-term`` SIGTERM is ignored (``SIG_IGN``), so only SIGKILL ends it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import sys
import threading
import time

from ai_lease.run.isolation.ladder import install_child_handlers

REAL_TIME = "a child process stuck on purpose in a real blocking call"


KEEP: list[object] = []  # open files and sockets, held for the process's life


def stuck_sleep() -> None:
    time.sleep(3600)  # the stuck C call, in a thread


def stuck_recv(sock: socket.socket) -> None:
    sock.recv(1)  # blocks forever: the peer never sends, no timeout


def stuck_busy() -> None:
    n = 0
    while True:  # burns CPU, holding the GIL between switch intervals
        n = (n * 31 + 7) % 1_000_003


def stuck_c_loop() -> None:
    # One endless C call holding the GIL that never checks for signals (unlike the regex
    # engine, which does): no Python signal handler runs, so SIGTERM is never honoured,
    # but faulthandler's C-level handler still dumps the stack.
    sum(itertools.repeat(1))


async def stuck_await() -> None:
    await asyncio.get_running_loop().create_future()  # awaits forever; the loop stays alive


def main(mode: str, workdir: str, ignore_term: bool) -> None:
    temp = os.path.join(workdir, "temp.txt")

    def on_terminate() -> None:
        with open(os.path.join(workdir, "terminated"), "w") as f:
            f.write(mode)
        os.remove(temp)
        os._exit(0)  # the hook ran: leave now, whatever the threads are doing

    for name in ("a.log", "b.log"):
        KEEP.append(open(os.path.join(workdir, name), "w"))  # held open
    with open(temp, "w") as f:
        f.write("scratch")
    left, right = socket.socketpair()
    KEEP.extend([left, right])
    install_child_handlers(os.path.join(workdir, "dump.txt"), on_terminate=on_terminate)
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "sleep":
        threading.Thread(target=stuck_sleep, name="stuck", daemon=True).start()
    open(os.path.join(workdir, "ready"), "w").close()
    if mode == "recv":
        stuck_recv(left)
    elif mode == "busy":
        stuck_busy()
    elif mode == "cloop":
        stuck_c_loop()
    elif mode == "await":
        asyncio.run(stuck_await())
    else:
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--ignore-term" in sys.argv[3:])
