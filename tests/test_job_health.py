"""JobState.health: the first seed's four states (section 16), on explicit store times."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ai_lease.job import Health, JobState, Status
from ai_lease.lease import rules
from ai_lease.lease.base import Fence

NOW = 1_000.0
RENEW = 2.0
MNP = 10.0


def running(*, beat_age: float, progress_age: float, lease_left: float = 30.0) -> JobState:
    return JobState(
        key="k",
        status=Status.RUNNING,
        owner_id="api-1#1.aa",
        heartbeat_at=NOW - beat_age,
        last_progress_at=NOW - progress_age,
        lease_expires_at=NOW + lease_left,
        max_no_progress=MNP,
        renew_interval=RENEW,
        read_at=NOW,
    )


@pytest.mark.parametrize(
    ("beat_age", "progress_age", "grace", "expected"),
    [
        (1.0, 1.0, 0.0, Health.HEALTHY),
        (RENEW, MNP, 0.0, Health.HEALTHY),  # both at their bound: still fresh
        (1.0, MNP + 0.1, 0.0, Health.ZOMBIE),  # renewing, but no progress
        (RENEW + 0.1, 1.0, 0.0, Health.NODE_LOST),  # silent, progress still fresh
        (RENEW + 0.1, MNP + 0.1, 0.0, Health.DEAD),
        (RENEW + 0.5, MNP + 0.5, 1.0, Health.HEALTHY),  # grace widens both bounds
        (RENEW + 1.5, MNP + 1.5, 1.0, Health.DEAD),
        (2 * RENEW, 1.0, None, Health.HEALTHY),  # default grace: one renew interval
        (2 * RENEW + 0.1, 1.0, None, Health.NODE_LOST),
        (1.0, MNP + RENEW + 0.1, None, Health.ZOMBIE),
    ],
)
def test_four_states(
    beat_age: float, progress_age: float, grace: float | None, expected: Health
) -> None:
    assert running(beat_age=beat_age, progress_age=progress_age).health(grace) is expected


def test_silent_owner_with_a_live_lease_is_node_lost_not_zombie() -> None:
    """A SIGKILLed owner's lease runs on for its TTL; its heartbeat stops at once."""
    job = running(beat_age=5 * RENEW, progress_age=1.0, lease_left=25.0)
    assert job.lease_live and job.health(0.0) is Health.NODE_LOST


def test_renewing_owner_with_a_lapsed_lease_follows_its_heartbeat() -> None:
    """The heartbeat's age decides, not the lease (a fresh renewal is a live owner)."""
    job = running(beat_age=0.5, progress_age=1.0, lease_left=-1.0)
    assert job.health(0.0) is Health.HEALTHY


def test_record_without_renew_interval_judges_heartbeat_by_its_lease() -> None:
    """A record written before the renew interval was kept: the old rule."""
    live = JobState(
        key="k",
        status=Status.RUNNING,
        heartbeat_at=NOW - 100,
        last_progress_at=NOW - 1,
        lease_expires_at=NOW + 5,
        max_no_progress=MNP,
        read_at=NOW,
    )
    assert live.health(0.0) is Health.HEALTHY
    lapsed = JobState(**{**live.__dict__, "lease_expires_at": NOW - 1})
    assert lapsed.health(0.0) is Health.NODE_LOST


@pytest.mark.parametrize("status", [Status.PENDING, Status.DONE, Status.FAILED, Status.CANCELLED])
def test_only_running_jobs_have_health(status: Status) -> None:
    job = JobState(key="k", status=status, renew_interval=RENEW, read_at=NOW)
    assert job.health() is None


def test_renew_and_acquire_rules_write_the_renew_interval() -> None:
    """The pure rules (SQLite's) keep the interval in force in the record."""
    _, outcome = rules.acquire(
        None,
        "k",
        "api-1#1.aa",
        NOW,
        ttl=30,
        max_no_progress=MNP,
        stall_policy="expire",
        fingerprint=None,
        max_attempts=None,
        renew_interval=RENEW,
    )
    job = outcome.job
    assert job.renew_interval == RENEW
    fence = Fence.of(job)
    renewed, answer = rules.renew(
        job, fence, NOW + 1, ttl=30, stage="load", progress_version=1, max_no_progress=MNP, grace=3
    )
    assert answer.ok and renewed is not None and renewed.renew_interval == 3


@pytest.mark.parametrize(
    ("before", "after", "same"),
    [
        ("api-1#1.aa", "api-1#2.bb", True),
        ("api-1#1.aa", "api-2#1.aa", False),
        ("host#a#1.x", "host#a#7.y", True),  # a node id holding '#': its last one splits
        ("A", "A", True),  # no '#': the whole id names the node
        ("A", "B", False),
    ],
)
def test_same_node_is_the_part_before_the_last_hash(before: str, after: str, same: bool) -> None:
    assert (rules.node_of(before) == rules.node_of(after)) is same


# -- docs/concepts.md's examples: the seed's timeline (section 6) through the store's rules ------

SEED_TTL, SEED_RENEW, SEED_MNP = 30.0, 5.0, 20.0
T0 = 10_000.0


def seed_owner(renewals: tuple[float, ...]) -> JobState:
    """The record after the store's rules: acquired at 0 s, progress published at the 5 s
    renewal (version 1), then renewals at ``renewals`` (seconds) with no new progress."""
    _, outcome = rules.acquire(
        None,
        "k",
        "node-a#1.aa",
        T0,
        ttl=SEED_TTL,
        max_no_progress=SEED_MNP,
        stall_policy="expire",
        fingerprint=None,
        max_attempts=None,
        renew_interval=SEED_RENEW,
    )
    job = outcome.job
    for at, version in ((5.0, 1), *((t, 1) for t in renewals)):
        renewed, answer = rules.renew(
            job,
            Fence.of(job),
            T0 + at,
            ttl=SEED_TTL,
            stage="call_ai",
            progress_version=version,
            max_no_progress=SEED_MNP,
            grace=SEED_RENEW,
        )
        assert answer.ok and renewed is not None, (at, answer)
        job = renewed
    return job


HUNG = (10.0, 15.0, 20.0, 25.0)  # the seed's owner: hung at 6 s, its keeper renews until 25 s
KILLED = (10.0,)  # the same owner SIGKILLed at 12 s instead: no renewal after 10 s


@pytest.mark.parametrize(
    ("renewals", "read_at", "beat_age", "progress_age", "lease_left", "expected"),
    [
        pytest.param(HUNG, 12.0, 2.0, 7.0, 28.0, Health.HEALTHY, id="healthy-12s"),
        pytest.param(HUNG, 20.0, 0.0, 15.0, 30.0, Health.HEALTHY, id="hung-but-healthy-20s"),
        pytest.param(HUNG, 33.0, 8.0, 28.0, 22.0, Health.ZOMBIE, id="zombie-33s"),
        pytest.param(HUNG, 40.0, 15.0, 35.0, 15.0, Health.DEAD, id="dead-40s"),
        pytest.param(KILLED, 22.0, 12.0, 17.0, 18.0, Health.NODE_LOST, id="node-lost-22s"),
        pytest.param(KILLED, 31.0, 21.0, 26.0, 9.0, Health.DEAD, id="killed-dead-31s"),
    ],
)
def test_concepts_examples(
    renewals: tuple[float, ...],
    read_at: float,
    beat_age: float,
    progress_age: float,
    lease_left: float,
    expected: Health,
) -> None:
    """Each example in docs/concepts.md's health table, with the seed's timings (renew 5 s,
    max_no_progress 20 s, default grace 5 s: heartbeat fresh <= 10 s, progress <= 25 s)."""
    done = tuple(at for at in renewals if at <= read_at)  # the renewals made by then
    job = dataclasses.replace(seed_owner(done), read_at=T0 + read_at)
    assert job.since_heartbeat == pytest.approx(beat_age)
    assert job.since_progress == pytest.approx(progress_age)
    assert job.lease_remaining == pytest.approx(lease_left)
    assert job.health() is expected


def test_concepts_cite_only_tests_that_exist() -> None:
    """docs/concepts.md's health and takeover sections name tests: each one exists, and
    each cited example id is one of test_concepts_examples' cases (so neither drifts)."""
    root = Path(__file__).parent.parent
    text = (root / "docs" / "concepts.md").read_text()
    section = text[text.index("## The four health states") : text.index("## Fencing tokens")]
    sources = ["tests/test_job_health.py", "tests/test_health_timeline.py"]
    sources += ["tests/test_runner_record.py", "ai_lease/testing/contract_record.py"]
    defined = set(re.findall(r"def (test_\w+)", "".join((root / s).read_text() for s in sources)))
    cited = set(re.findall(r"(?<![/\w])(test_\w+)\b(?!\.)", section)) - {"test_other_node_after_"}
    assert cited and cited <= defined, cited - defined
    marks = test_concepts_examples.pytestmark  # type: ignore[attr-defined]
    cases = {case.id for mark in marks for case in mark.args[1]}
    ids = set(re.findall(r"`(?:test_concepts_examples)?\[([\w-]+)\]`", section))
    assert len(ids) == len(cases) and ids <= cases, (ids, cases)
