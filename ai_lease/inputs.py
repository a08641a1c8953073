"""Reading a job's ``input_file`` on the submitter's side: bounded, regular files only.

A worker never opens a path taken from the store (a submitter could name any file the
worker can read: ``/proc/self/environ`` holds its keys). So whoever submits a job reads
its input file here and stores the text; :func:`resolve_input` turns a job with an
``input_file`` into the same job with ``input`` set.

The file must be a regular file (not a FIFO, a device, a directory, or a pseudo-file under
``/proc``, ``/sys`` or ``/dev``), at most ``max_bytes`` long, and UTF-8. It is opened with
``O_NONBLOCK``, so naming a FIFO is refused at once instead of hanging.

>>> resolve_input(Job("k", input_file="notes.txt")).input       # doctest: +SKIP
'the text of notes.txt'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
from pathlib import Path

from ai_lease.errors import JobSpecError
from ai_lease.job import Job

__all__ = ["DEFAULT_MAX_INPUT_BYTES", "read_input_file", "resolve_input"]

DEFAULT_MAX_INPUT_BYTES = 16 * 2**20
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFSOCK: "a socket",
}


@functools.cache
def _pseudo_devices() -> frozenset[int]:
    """The devices of /proc, /sys and /dev where they are mounts of their own (a file on
    one of them is never an input); a plain folder on the root file system is not one."""
    found = set()
    with contextlib.suppress(OSError):
        root_device = os.stat("/").st_dev
        for root in _PSEUDO_ROOTS:
            with contextlib.suppress(OSError):
                found.add(os.stat(root).st_dev)
        found.discard(root_device)
    return frozenset(found)


def _refuse(path: Path, why: str) -> JobSpecError:
    return JobSpecError(f"input_file {str(path)!r}: {why}")


def read_input_file(path: str | Path, max_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``max_bytes`` bytes."""
    path = Path(path)
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + "/") for root in _PSEUDO_ROOTS):
        raise _refuse(path, f"{real!r} is a pseudo-file, not a regular file: give a text file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise _refuse(path, f"cannot open it ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if info.st_dev in _pseudo_devices():  # reached through a link swapped in meanwhile
            raise _refuse(path, "it is a pseudo-file, not a regular file: give a text file")
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise _refuse(path, f"it is {kind}: give a regular text file")
        if info.st_size > max_bytes:
            raise _refuse(path, f"{info.st_size} bytes is over job.max_input_bytes ({max_bytes})")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise _refuse(path, f"cannot read it ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise _refuse(path, f"it grew past job.max_input_bytes ({max_bytes}) while read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(path, f"not UTF-8 text (byte {exc.start})") from None


def resolve_input(job: Job, max_bytes: int = DEFAULT_MAX_INPUT_BYTES) -> Job:
    """``job`` with its ``input_file`` read into ``input`` (unchanged when it names none)."""
    if job.input_file is None:
        return job
    text = read_input_file(job.input_file, max_bytes)
    return dataclasses.replace(job, input=text, input_file=None)
