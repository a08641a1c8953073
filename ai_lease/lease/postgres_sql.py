"""The PostgreSQL store's lease functions (filled in next)."""

from __future__ import annotations

FUNCTIONS = ""
