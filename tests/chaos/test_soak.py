"""A short soak in the suite, so that ``python -m tests.chaos.soak`` keeps working.

``CHAOS_SOAK_SECONDS`` makes it longer (the long runs are documented in
docs/reliability.md and run from the command line).
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.soak import SoakOptions, soak
from tests.harness.chaos_cluster import report

pytestmark = [pytest.mark.chaos, pytest.mark.redis]


async def test_short_soak_keeps_every_invariant() -> None:
    """Workers under random kills, pauses, SIGTERMs, Redis pauses and black holes: every
    job ends DONE or FAILED, with no invariant violation."""
    seconds = float(os.environ.get("CHAOS_SOAK_SECONDS", "14"))
    result = await soak(SoakOptions(seconds=seconds, workers=3, fault_every=4.0, seed=8))
    assert not result.violations, "\n".join(result.violations[:5])
    assert result.jobs > 0 and result.done + result.failed == result.jobs, result.summary()
    assert sum(result.faults.values()) >= 2, result.summary()
    # A takeover is a re-attempt by another node; a same-node re-acquire is only an attempt.
    assert 0 <= result.takeovers <= result.reattempts, result.summary()
    report(
        "soak",
        "redis",
        seconds=seconds,
        jobs=result.jobs,
        done=result.done,
        failed=result.failed,
        faults=sum(result.faults.values()),
        reattempts=result.reattempts,
        takeovers=result.takeovers,
    )
