"""JSON-lines framing for the lean adapter: bytes in, one payload per line out.

A line splitter, not a protocol (Ollama's ``application/x-ndjson`` is one JSON value per
``\\n``-ended line). The same interface as :class:`~ai_lease.providers.sse.SSEFramer`:
``feed`` per network read, ``close`` at the body's end. A ``\\r`` before the ``\\n`` is
dropped and blank lines are skipped (a proxy's keep-alive newlines); what a line holds is
the parser's business.

Linear in the bytes received, whatever their shape: each read is split once; the unfinished
line's pieces are kept in a list and joined only when its ``\\n`` comes; a line longer than
``max_event_bytes`` raises :class:`~ai_lease.providers.sse.EventTooLarge` as soon as it
passes the limit, so the buffer never grows past it.
"""

from __future__ import annotations

from ai_lease.providers.sse import EventTooLarge
from ai_lease.timeouts import StreamLimits

__all__ = ["EventTooLarge", "NDJSONFramer"]


class NDJSONFramer:
    """Fed each network read, returns the lines it completed (without their line ends).

    >>> framer = NDJSONFramer(1024)
    >>> framer.feed(b'{"a": 1}\\n{"b"'), framer.feed(b": 2}\\r\\n\\n")
    ([b'{"a": 1}'], [b'{"b": 2}'])
    """

    __slots__ = ("_limit", "_pending", "_size")

    def __init__(self, max_event_bytes: int = StreamLimits.max_event_bytes) -> None:
        self._limit = max_event_bytes
        self._pending: list[bytes] = []  # the unfinished line, in pieces (no "\n" yet)
        self._size = 0

    def feed(self, raw: bytes) -> list[bytes]:
        """The non-blank lines ``raw`` completed."""
        end = raw.find(b"\n")
        if end < 0:
            self._keep(raw)
            return []
        # Fast path, once per streamed token: a read that is exactly one whole line.
        if end == len(raw) - 1 and not self._pending:
            line = raw[:-2] if raw[-2:-1] == b"\r" else raw[:-1]
            if len(line) > self._limit:
                raise EventTooLarge(self._limit)
            return [line] if line and not line.isspace() else []
        lines = raw.split(b"\n")
        tail = lines.pop()
        if self._pending:
            if self._size + end > self._limit:
                raise EventTooLarge(self._limit)
            self._pending.append(lines[0])
            lines[0] = b"".join(self._pending)
        self._pending, self._size = ([tail], len(tail)) if tail else ([], 0)
        if self._size > self._limit:
            raise EventTooLarge(self._limit)
        return self._lines(lines)

    def close(self) -> list[bytes]:
        """At the body's end: a last line that had no ``\\n`` after it (the parser judges
        it: a whole JSON value is one, a cut one is malformed)."""
        last = b"".join(self._pending)
        self._pending, self._size = [], 0
        return self._lines([last])

    def _keep(self, raw: bytes) -> None:
        self._pending.append(raw)
        self._size += len(raw)
        if self._size > self._limit:
            raise EventTooLarge(self._limit)

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out = []
        limit = self._limit
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if len(line) > limit:
                raise EventTooLarge(limit)
            if line and not line.isspace():
                out.append(line)
        return out
