"""Leases: the store protocols and their answers, the rules, refusal codes, fencing and
renewal. The stores that keep them are in :mod:`ai_lease.stores`.

The names below are loaded when first used, so importing one module of this package (its
events, say) loads no other (``ai-lease --help`` stays light: tests/test_import_discipline.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ai_lease.lease.base import (
        Acquired,
        AcquireOutcome,
        Fence,
        Finished,
        Following,
        JobListing,
        JobPage,
        LeaseStore,
        Renewal,
    )
    from ai_lease.refusal import Refusal

__all__ = [
    "AcquireOutcome",
    "Acquired",
    "Fence",
    "Finished",
    "Following",
    "JobListing",
    "JobPage",
    "LeaseStore",
    "Refusal",
    "Renewal",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = "ai_lease.refusal" if name == "Refusal" else "ai_lease.lease.base"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
