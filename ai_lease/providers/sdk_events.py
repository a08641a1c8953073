"""The official SDK's event streams, bounded and spec-true, through public API only.

The SDK (``openai`` 3.x on httpx2; 1.x and 2.x on httpx) parses server-sent events itself;
it grows a line without bound and dispatches an event that has no ``data:`` (``retry: 3000``
alone), which it then fails to decode as JSON. Its public surface offers no hook into that
parser, so the bound is put on the bytes before it: an httpx2 ``response`` event hook
(public httpx2 API, passed in through the SDK's public ``http_client=``) replaces an event
stream's body with :class:`EventWatch`, which reads the original body *decoded*
(``Response.aiter_bytes()`` on a second response over the same stream, so gzip is undone
before anything is measured) and hands the SDK the same bytes, line by line:

* a line or event longer than ``max_event_bytes`` raises :class:`~.sse.EventTooLarge`;
* ``id:``, ``retry:`` and ``event:`` lines are dropped — ai_lease reads none of them, and an
  event made only of them is then not dispatched, as the SSE spec says;
* events with data are counted, and a ``[DONE]`` is noted, for the adapter's errors.

Only a bounded line splitter is written here; the SSE parsing and the chunk models stay the
SDK's. The HTTP module is the one the installed SDK is built on (:func:`sdk_http_module`):
``httpx2`` for openai 3.x, ``httpx`` before; both have the same ``Response`` and
``AsyncByteStream`` API.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from ai_lease.providers.rate_headers import heard
from ai_lease.providers.sse import EventTooLarge


def sdk_http_module() -> str:
    """The name of the HTTP package the installed openai SDK's client is built on."""
    import openai

    for cls in openai.DefaultAsyncHttpxClient.__mro__:
        root = cls.__module__.partition(".")[0]
        if root not in ("openai", "builtins"):
            return root
    return "httpx"


if TYPE_CHECKING:
    import httpx2
else:
    httpx2 = importlib.import_module(sdk_http_module())

__all__ = ["WATCH", "EventWatch", "sdk_http_module", "watching_hook"]

WATCH = "ai_lease.event_watch"  # the response extension that holds a stream's EventWatch
_DROPPED = frozenset((b"id", b"retry", b"event"))


class EventWatch(httpx2.AsyncByteStream):
    """An event stream's decoded body, bounded and filtered (see the module's docstring)."""

    def __init__(self, source: httpx2.Response, max_event_bytes: int) -> None:
        self._source, self.limit = source, max_event_bytes
        self.events, self.done = 0, False
        self._size, self._carry, self._data = 0, b"", False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._source.aiter_bytes():
            if kept := self._lines(self._carry + chunk if self._carry else chunk):
                yield kept
        if self._carry:
            yield self._carry

    async def aclose(self) -> None:
        await self._source.aclose()

    def _lines(self, data: bytes) -> bytes:
        """The complete lines of ``data`` that the SDK should see; the rest is carried."""
        lines = data.splitlines(keepends=True)
        self._carry = lines.pop() if lines and lines[-1][-1:] not in (b"\n", b"\r") else b""
        if self._size + len(self._carry) > self.limit:
            raise EventTooLarge(self.limit)
        kept = [line for line in lines if self._keep(line)]
        return b"".join(kept)

    def _keep(self, line: bytes) -> bool:
        body = line.rstrip(b"\r\n")
        if not body:  # an event's end
            self.events += self._data
            self._size, self._data = 0, False
            return True
        self._size += len(body)
        if self._size > self.limit:
            raise EventTooLarge(self.limit)
        if body[:5] == b"data:":
            value = body[5:].removeprefix(b" ")
            self.done = self.done or (not self._data and value.startswith(b"[DONE]"))
            self._data = self._data or bool(value)
            return True
        return body[:1] == b":" or body.partition(b":")[0] not in _DROPPED


def watching_hook(max_event_bytes: int) -> Callable[[httpx2.Response], Awaitable[None]]:
    """An httpx2 ``response`` hook that puts an :class:`EventWatch` on every event stream."""

    async def hook(response: httpx2.Response) -> None:
        if response.status_code < 300:  # an error's headers go with its ProviderError
            heard(response.headers)  # the rate-limit headers, to the call's [limits]
        if "text/event-stream" not in response.headers.get("content-type", ""):
            return
        source = httpx2.Response(
            response.status_code, headers=response.headers.copy(), stream=response.stream
        )
        watch = EventWatch(source, max_event_bytes)
        if "content-encoding" in response.headers:  # decoded by the watch already
            del response.headers["content-encoding"]
        response.stream = watch
        response.extensions[WATCH] = watch

    return hook
