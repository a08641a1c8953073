"""Server-sent events framing for the lean adapter: bytes in, ``data:`` payloads out.

A small bytes-level framer (measured against httpx-sse in docs/benchmarks.md): events end at
a blank line; a read that is one whole event in the shapes providers send per token — a
``data: …`` line (OpenAI chat), an ``event:`` line and a ``data:`` line (Anthropic,
Responses), a ``data:`` line ended ``\\r\\n\\r\\n`` (Gemini) — takes a fast path; anything
else (comments, several data lines, ``\\r\\n`` line ends, other fields) is parsed line by
line per the SSE spec. ``event``/``id``/``retry`` are ignored.

Linear in the bytes received, whatever their shape: each read is searched once (plus the one
byte before it) for an event's end; the unfinished event's pieces are kept in a list and
joined only when it ends; an event longer than ``max_event_bytes`` raises
:class:`EventTooLarge`, so the buffer never grows past it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from ai_lease.timeouts import StreamLimits

__all__ = ["EventTooLarge", "SSEFramer", "sse_batches"]


class EventTooLarge(Exception):
    """One event outgrew ``limit`` bytes (the stream is then refused, never buffered)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class SSEFramer:
    """Fed each network read, returns the ``data:`` payloads of the events it completed.

    >>> framer = SSEFramer(1024)
    >>> framer.feed(b"data: a\\n\\ndata: b"), framer.feed(b"\\n\\n")
    ([b'a'], [b'b'])
    """

    __slots__ = ("_cr", "_last", "_limit", "_pending", "_size")

    def __init__(self, max_event_bytes: int = StreamLimits.max_event_bytes) -> None:
        self._limit = max_event_bytes
        self._pending: list[bytes] = []  # the unfinished event, in pieces (no blank line)
        self._size = 0
        self._last = b""  # the last byte seen: half of a "\n\n" split across two reads
        self._cr = False  # a read ended in "\r", which may be half of a "\r\n"

    def feed(self, raw: bytes) -> list[bytes]:
        """The payloads of the events ``raw`` completed (comments and empty events skipped)."""
        # Fast path, once per streamed token: a read that is exactly one "data: …" event.
        if (
            raw[:6] == b"data: "
            and raw.find(b"\n") == len(raw) - 2
            and raw[-1:] == b"\n"
            and not self._pending
            and not self._cr
            and b"\r" not in raw
        ):
            if len(raw) - 2 > self._limit:
                raise EventTooLarge(self._limit)
            self._last = b"\n"
            return [raw[6:-2]]
        if not self._pending and not self._cr and (one := self._one_event(raw)) is not None:
            return one
        if self._cr:
            raw, self._cr = b"\r" + raw, False
        if b"\r" in raw:
            raw = self._normalized(raw)
        if not raw:
            return []
        if b"\n\n" not in raw and not (self._last == b"\n" and raw[:1] == b"\n"):
            self._keep(raw)
            return []
        pending = self._pending
        buffer = b"".join(pending) + raw if pending else raw
        self._last = raw[-1:]
        *events, tail = buffer.split(b"\n\n")
        self._pending, self._size = ([tail], len(tail)) if tail else ([], 0)
        if self._size > self._limit:
            raise EventTooLarge(self._limit)
        return self._payloads(events)

    def _one_event(self, raw: bytes) -> list[bytes] | None:
        """The payload of a read that is exactly one event of the two other shapes providers
        send per token: ``event: <type>\\ndata: …\\n\\n`` (Anthropic, OpenAI's Responses API)
        and ``data: …\\r\\n\\r\\n`` (Gemini); None for anything else. (The general path
        parses those line by line, or normalises line ends first: ~2-3x the cost.)"""
        if raw[:7] == b"event: " and raw[-2:] == b"\n\n":
            line = raw.find(b"\n")
            if (
                raw[line + 1 : line + 7] != b"data: "
                or raw.find(b"\n", line + 1) != len(raw) - 2
                or b"\r" in raw
            ):
                return None
            payload, size = raw[line + 7 : -2], len(raw) - 2
        elif raw[:6] == b"data: " and raw[-4:] == b"\r\n\r\n":
            end = len(raw) - 4
            if raw.find(b"\r") != end or raw.find(b"\n") != end + 1:
                return None
            payload, size = raw[6:end], end
        else:
            return None
        if size > self._limit:
            raise EventTooLarge(self._limit)
        self._last = b"\n"
        return [payload]

    def close(self) -> list[bytes]:
        """At the body's end: the payload of an event that had no blank line after it."""
        if self._cr:
            self._pending.append(b"\n")
        last = slow_event(b"".join(self._pending))
        self._pending, self._size = [], 0
        return [last] if last else []

    def _normalized(self, raw: bytes) -> bytes:
        if raw.endswith(b"\r"):
            raw, self._cr = raw[:-1], True
        return raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _keep(self, raw: bytes) -> None:
        self._pending.append(raw)
        self._size += len(raw)
        self._last = raw[-1:]
        if self._size > self._limit:
            raise EventTooLarge(self._limit)

    def _payloads(self, events: list[bytes]) -> list[bytes]:
        batch = []
        limit = self._limit
        for event in events:
            if len(event) > limit:
                raise EventTooLarge(limit)
            if event[:6] == b"data: " and b"\n" not in event:
                batch.append(event[6:])
            elif payload := slow_event(event):
                batch.append(payload)
        return batch


def slow_event(event: bytes) -> bytes | None:
    """The data of one event parsed line by line per the SSE spec (None: no data line)."""
    data = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


async def sse_batches(
    chunks: AsyncIterator[bytes], max_event_bytes: int = StreamLimits.max_event_bytes
) -> AsyncGenerator[list[bytes], None]:
    """Per network read, the ``data:`` payloads of the events it completed."""
    framer = SSEFramer(max_event_bytes)
    async for raw in chunks:
        if batch := framer.feed(raw):
            yield batch
    if last := framer.close():
        yield last
