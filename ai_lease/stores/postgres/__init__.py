"""The PostgreSQL store: one plpgsql function per operation, through psycopg (the
``postgres`` extra).

``PostgresStore`` is loaded when first named, so importing one part of the package (its schema
version, say) loads neither the store nor its driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ai_lease.stores.postgres.store import PostgresStore

__all__ = ["PostgresStore"]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from ai_lease.stores.postgres.store import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
