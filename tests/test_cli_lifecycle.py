"""`ai-lease cancel / retry / rm / prune` and an interrupted `submit`, through the real entry
point on SQLite and Redis, and the store operations under them (the JobAdmin contract)."""

from __future__ import annotations

from ai_lease.testing.contract_queue import JobAdminContract


class TestAdminContract(JobAdminContract):
    """Both built-in stores, via the parametrized ``store`` fixture."""
