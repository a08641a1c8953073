"""One thing every store, provider, worker and client shares: ``async with`` closes it.

>>> async with SQLiteStore("jobs.db") as store:     # doctest: +SKIP
...     await store.get("report-42")

Leaving the block calls ``aclose()``, also when the body raised (trio's ``AsyncResource``).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncResource"]


class AsyncResource:
    """A mixin: ``async with x:`` returns ``x`` and awaits ``x.aclose()`` on the way out."""

    async def aclose(self) -> None:
        """Release what the object holds (connections, threads); safe to call twice."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
