"""What the CLI writes to a terminal is shown, never obeyed.

When stdout or stderr is a terminal, :func:`guard_terminal` puts an :class:`InertStream` in
front of it: every text written through it — a model's answer from ``result`` or ``submit``,
an error body in ``ai-lease: error: …``, keys and owners in ``ls``, ``status``, ``events`` —
has its control, format and separator characters written as visible escapes
(:func:`ai_lease.text_safety.inert`). A pipe or a file gets the bytes as they are. The live
panel (rich) draws on the raw terminal with its own escape sequences and makes the texts it
shows inert itself (:func:`raw` hands it the stream underneath).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from typing import TextIO

from ai_lease.text_safety import inert

__all__ = ["InertStream", "guard_terminal", "raw"]


class InertStream(io.TextIOBase):
    """A text stream in front of a terminal that writes every text :func:`inert`."""

    def __init__(self, terminal: TextIO) -> None:
        self.terminal = terminal

    def write(self, text: str) -> int:
        self.terminal.write(inert(text))
        return len(text)

    def flush(self) -> None:
        self.terminal.flush()

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.terminal.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.terminal.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return self.terminal.errors


def _isatty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed, or not a file at all
        return False


def guard_terminal() -> Callable[[], None]:
    """Guard ``sys.stdout`` and ``sys.stderr`` where they are terminals; the undo."""
    saved = sys.stdout, sys.stderr
    if _isatty(sys.stdout) and not isinstance(sys.stdout, InertStream):
        sys.stdout = InertStream(sys.stdout)
    if _isatty(sys.stderr) and not isinstance(sys.stderr, InertStream):
        sys.stderr = InertStream(sys.stderr)

    def undo() -> None:
        sys.stdout, sys.stderr = saved

    return undo


def raw(stream: TextIO) -> TextIO:
    """The terminal under a guarded stream (``stream`` itself if it is not one)."""
    return stream.terminal if isinstance(stream, InertStream) else stream
