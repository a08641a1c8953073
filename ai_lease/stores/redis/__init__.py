"""The Redis store: one Lua script per operation, through redis-py.

``RedisStore`` is loaded when first named, so importing one part of the package (its schema
version, say) loads neither the store nor its driver."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ai_lease.stores.redis.store import RedisStore

__all__ = ["RedisStore"]


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        from ai_lease.stores.redis.store import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
