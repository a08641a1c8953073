"""The PostgreSQL queue's functions (helper pgqueue's file; empty until it is merged)."""

from __future__ import annotations

FUNCTIONS = ""
