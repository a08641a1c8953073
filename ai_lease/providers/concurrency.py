"""``[provider] max_concurrency``: at most N model calls at once per provider, in one process.

llama.cpp's server has one slot by default and, with ``interrupt_requests``, ends a running
stream when another request arrives: several jobs calling it at once interrupt each other.
:func:`limit_calls` wraps a provider so that at most ``limit`` of its calls run at once per
``(provider name, base_url)`` in this process (an :class:`asyncio.Semaphore` per key,
per event loop); a call waits for a free slot before it sends anything and holds it until
its answer has ended.

The wait is not the model's latency: a streamed call announces "a slot is ours" with an
empty batch, where the stream guard starts its first-token clock (as it does for a pooled
connection). It is still time without progress: it counts against the stage's
``max_no_progress`` (and its hard deadline), so a queue longer than that budget needs a
larger one. Limits across processes (a fleet of workers) are not this module's.

>>> provider = limit_calls(OpenAICompatProvider(base_url=url, model="m"), 1)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest, Completion, Delta, Provider

__all__ = ["MAX_CONCURRENCY", "LimitedProvider", "limit_calls"]

MAX_CONCURRENCY = 10_000
"""The largest ``max_concurrency`` accepted."""

_Key = tuple[str, str, str, int]
_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[_Key, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def limit_calls(provider: Provider, limit: int, *, base_url: str | None = None) -> Provider:
    """``provider`` with at most ``limit`` calls at once per (name, ``base_url``) in
    this process; ``limit`` is 1 to :data:`MAX_CONCURRENCY` (else :class:`ConfigError`)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_CONCURRENCY:
        raise ConfigError(
            f"provider.max_concurrency: {limit!r} is not a count from 1 to {MAX_CONCURRENCY}"
        )
    return LimitedProvider(provider, limit, base_url)


def _slot(key: _Key) -> asyncio.Semaphore:
    """The semaphore of ``key`` in the running loop (a semaphore belongs to one loop)."""
    loop = asyncio.get_running_loop()
    per_loop = _slots.setdefault(loop, {})
    semaphore = per_loop.get(key)
    if semaphore is None:
        semaphore = per_loop[key] = asyncio.Semaphore(key[3])
    return semaphore


class LimitedProvider:
    """A provider whose calls take one of ``limit`` slots first (see the module's docstring).
    Everything else (``name``, ``model``, ``http``, ``aclose()``…) is the wrapped one's."""

    announces_connection = True  # stream_batches() yields [] once a slot (and connection) is held

    def __init__(self, inner: Provider, limit: int, base_url: str | None) -> None:
        self.inner, self.limit, self.name = inner, limit, inner.name
        self.base_url = base_url or str(getattr(inner, "base_url", "") or "")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"limit_calls({self.inner!r}, {self.limit})"

    def _key(self, request: ChatRequest) -> _Key:
        # Per server, not per model name: a server's slots are its own whatever model a job
        # names (and a job-chosen model string must neither bypass the cap nor grow this).
        return (self.inner.name, "", self.base_url, self.limit)

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(self.stream_batches(request)) as batches:
            async for batch in batches:
                for delta in batch:
                    yield delta

    async def stream_batches(self, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
        """The wrapped provider's batches, once a slot is held. The guard's first-token
        clock starts at the first ``[]``: the wrapped provider's own "connection held" when
        it announces one (so a pool's wait is not charged either), else ours, at once."""
        async with _slot(self._key(request)):
            batches = getattr(self.inner, "stream_batches", None)
            if batches is None or not getattr(self.inner, "announces_connection", False):
                yield []  # a slot is ours: the clocks start here
            source = batches(request) if batches is not None else _batched(self.inner, request)
            async with contextlib.aclosing(source) as inner:
                async for batch in inner:
                    yield list(batch)

    async def complete(self, request: ChatRequest) -> Completion:
        async with _slot(self._key(request)):
            return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _batched(provider: Provider, request: ChatRequest) -> AsyncGenerator[list[Delta], None]:
    async with contextlib.aclosing(provider.stream(request)) as deltas:  # type: ignore[type-var]
        async for delta in deltas:
            yield [delta]
