"""The SQLite store: one file, one transaction per operation (the embedded default).

``SQLiteStore`` is loaded when first named, so importing one part of the package (its schema
version, say) loads neither the store nor its driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ai_lease.stores.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]


def __getattr__(name: str) -> Any:
    if name == "SQLiteStore":
        from ai_lease.stores.sqlite.store import SQLiteStore

        return SQLiteStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
