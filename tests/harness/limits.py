"""What the limit tests share: the runners' lease timings (their ``slot_store`` fixture is in
tests/conftest.py)."""

from __future__ import annotations

from ai_lease import LeaseTimings, StageBudget

__all__ = ["limit_timings"]


def limit_timings(ttl: float, call_ai_hard: float, call_ai_idle: float = 10) -> LeaseTimings:
    """Short leases renewed often, and ``call_ai``'s budget: ``call_ai_idle`` seconds without
    progress, ``call_ai_hard`` in all."""
    return LeaseTimings(
        ttl=ttl,
        renew_interval=0.5,
        op_timeout=0.4,
        poll_interval=0.05,
        self_fence_margin=0.5,
        stage_budgets={"call_ai": StageBudget(call_ai_idle, call_ai_hard)},
    )
