"""Running the rule table (:mod:`ai_lease.testing.rule_cases`) against a store, or against the
pure rules with no store at all.

:func:`run_cases` reaches each case's starting state through real operations on a fresh key,
does the case's operation and reads the record back, through the public protocols only
(:class:`~ai_lease.lease.base.LeaseStore`, :class:`~ai_lease.lease.queue.JobQueue`'s
``submit``, :class:`~ai_lease.lease.admin.JobAdmin`'s ``retry``). All states are built first;
the cases that start "at once" run, then one real wait of
:data:`~ai_lease.testing.rule_cases.WAIT` seconds (a store judges time by its own clock,
the server's for Redis and PostgreSQL), then the "later" cases. :class:`RulesTarget` is the
same protocol over the functions of :mod:`ai_lease.lease.rules` and a virtual clock, whose
wait is instant. A third-party store checks itself with::

    observed = await run_cases(my_store, CASES)
    assert mismatches(CASES, observed) == []
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.job import JobState
from ai_lease.lease import rules
from ai_lease.lease.base import Acquired, AcquireOutcome, Fence, Finished, Following, Renewal
from ai_lease.testing.contract_support import key_for
from ai_lease.testing.rule_cases import LONG, OWNERS, WAIT, After, RuleCase, Step

__all__ = ["Observed", "RulesTarget", "SetupFailed", "apply", "mismatches", "run_cases"]

_ALIASES = {owner: alias for alias, owner in OWNERS.items()}


@dataclass(frozen=True, slots=True)
class Observed:
    """What a target answered to a case's operation and how the record stood afterwards."""

    answer: str
    after: After


class SetupFailed(AssertionError):
    """A step on the way to a starting state did not do what the state needs."""


async def run_cases(
    target: Any,
    cases: Iterable[RuleCase],
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> dict[str, Observed]:
    """Every case applied to ``target`` (a store, or a :class:`RulesTarget`), each on a key of
    its own; ``sleep`` (default: the target's own ``sleep`` if it has one, else
    ``asyncio.sleep``) makes the wait before the "later" cases."""
    wait = sleep or getattr(target, "sleep", None) or asyncio.sleep
    built: list[tuple[RuleCase, str, dict[str, Fence], int]] = []
    for case in cases:
        key, fences = key_for("rule"), dict[str, Fence]()
        for setup in case.state.steps:
            answer = await apply(target, key, setup, fences)
            if answer.startswith(("refused", "rejected", "conflict", "following", "finished")):
                raise SetupFailed(f"{case.state.name}: {setup} answered {answer!r}")
        built.append((case, key, fences, _token(await target.get(key))))
    observed: dict[str, Observed] = {}
    for later in (False, True):
        batch = [entry for entry in built if entry[0].state.later is later]
        if later and batch:
            await wait(WAIT)
        for case, key, fences, before in batch:
            answer = await apply(target, key, case.op, fences)
            observed[case.name] = Observed(answer, _after(await target.get(key), before))
    return observed


def mismatches(cases: Iterable[RuleCase], observed: dict[str, Observed]) -> list[str]:
    """One line per case whose observed answer or record differs from the table."""
    wrong = []
    for case in cases:
        seen, want = observed.get(case.name), Observed(case.answer, case.after)
        if seen != want:
            wrong.append(f"{case.name!r} ({case.state.name}, {case.op}): {seen} != {want}")
    return wrong


def _token(rec: JobState | None) -> int:
    return 0 if rec is None else rec.token


def _after(rec: JobState | None, before: int) -> After:
    if rec is None:
        return After(None)
    owner = None if rec.owner_id is None else _ALIASES.get(rec.owner_id, rec.owner_id)
    token = "higher" if rec.token > before else "same" if rec.token == before else "lower"
    return After(rec.status.value, owner, token, rec.attempts, rec.failure_kind)


async def _fence(target: Any, key: str, step: Step, fences: dict[str, Fence]) -> Fence:
    """The fence ``step``'s owner holds: the one it was granted, else the record's token
    under its own name (an owner who never held this job)."""
    assert step.by is not None, f"{step} needs an owner"
    if step.by in fences:
        return fences[step.by]
    return Fence(key, OWNERS[step.by], _token(await target.get(key)))


async def apply(target: Any, key: str, step: Step, fences: dict[str, Fence]) -> str:
    """Do ``step`` on ``key`` and say what it answered (the words of
    :class:`~ai_lease.testing.rule_cases.RuleCase`); a granted lease's fence is kept in
    ``fences`` under its owner's alias."""
    arg = step.arg
    try:
        if step.op == "acquire":
            assert step.by is not None
            won = await target.acquire(
                key,
                OWNERS[step.by],
                ttl=arg("ttl", LONG),
                max_no_progress=arg("max_no_progress", LONG),
                stall_policy=arg("stall_policy", "expire"),
                fingerprint=arg("fingerprint", None),
                max_attempts=arg("max_attempts", None),
            )
            if isinstance(won, Acquired):
                fences[step.by] = won.fence
            return _acquired(won)
        if step.op == "submit":
            return _returns(await target.submit(key, arg("spec", "{}"), arg("fingerprint", "")))
        if step.op == "cancel":
            return _returns(await target.cancel(key, arg("reason", "cancelled")))
        if step.op == "retry":
            return _returns(await target.retry(key))
        return await _fenced(target, step, await _fence(target, key, step, fences))
    except JobConflict:
        return "conflict"
    except FencingRejected as rejected:
        return f"rejected: {rejected.refusal.value}"


async def _fenced(target: Any, step: Step, fence: Fence) -> str:
    arg = step.arg
    if step.op == "renew":
        renewal: Renewal = await target.renew(
            fence,
            ttl=arg("ttl", LONG),
            stage=arg("stage", "call_ai"),
            progress_version=arg("progress_version", 0),
            max_no_progress=arg("max_no_progress", LONG),
            grace=arg("grace", 0.0),
        )
        if not renewal.ok:
            return f"refused: {renewal.reason.value if renewal.reason else None}"
        return "renewed, stalled" if renewal.stalled else "renewed"
    if step.op == "release":
        done = await target.release(
            fence,
            error=arg("error", None),
            snapshot=arg("snapshot", None),
            interrupted=arg("interrupted", False),
        )
        return "done" if done else "refused"
    if step.op == "report_stall":
        done = await target.report_stall(fence, arg("stage", "call_ai"), arg("snapshot", "stuck"))
        return "done" if done else "refused"
    if step.op == "commit":
        job: JobState = await target.commit(fence, arg("result", "the result"))
        return f"written {job.status.value}"
    if step.op == "fail":
        job = await target.fail(fence, arg("reason", "the reason"))
        return f"written {job.status.value}"
    raise ValueError(f"no such operation: {step.op!r}")


def _acquired(won: AcquireOutcome) -> str:
    if isinstance(won, Acquired):
        return f"takeover: {won.cause}" if won.takeover else "acquired"
    if isinstance(won, Following):
        return "following"
    assert isinstance(won, Finished)
    return f"finished {won.job.status.value}"


def _returns(rec: JobState | None) -> str:
    return "returns nothing" if rec is None else f"returns {rec.status.value}"


class RulesTarget:
    """The operations of a store done by the pure rules (:mod:`ai_lease.lease.rules`) on
    records held in a dict, at a virtual clock that moves 1 ms per operation; ``sleep``
    moves it on at once."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now
        self.records: dict[str, JobState] = {}

    async def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on the virtual clock."""
        self.now += seconds

    def _tick(self, key: str) -> JobState | None:
        self.now += 0.001
        return self.records.get(key)

    def _keep(self, key: str, new: JobState | None) -> None:
        if new is not None:
            self.records[key] = new

    async def get(self, key: str) -> JobState | None:
        """The record of ``key``, as the rules last left it."""
        return self.records.get(key)

    async def acquire(self, key: str, owner_id: str, **kw: Any) -> AcquireOutcome:
        """:func:`ai_lease.lease.rules.acquire`."""
        new, won = rules.acquire(self._tick(key), key, owner_id, self.now, **kw)
        self._keep(key, new)
        return won

    async def renew(self, fence: Fence, **kw: Any) -> Renewal:
        """:func:`ai_lease.lease.rules.renew`."""
        new, renewal = rules.renew(self._tick(fence.key), fence, self.now, **kw)
        self._keep(fence.key, new)
        return renewal

    async def release(self, fence: Fence, **kw: Any) -> bool:
        """:func:`ai_lease.lease.rules.release`."""
        new, done = rules.release(self._tick(fence.key), fence, self.now, **kw)
        self._keep(fence.key, new)
        return done

    async def commit(self, fence: Fence, result: str) -> JobState:
        """:func:`ai_lease.lease.rules.commit`."""
        new, job = rules.commit(self._tick(fence.key), fence, self.now, result)
        self._keep(fence.key, new)
        return job

    async def fail(self, fence: Fence, reason: str) -> JobState:
        """:func:`ai_lease.lease.rules.fail`."""
        new, job = rules.fail(self._tick(fence.key), fence, self.now, reason)
        self._keep(fence.key, new)
        return job

    async def report_stall(self, fence: Fence, stage: str | None, snapshot: str) -> bool:
        """:func:`ai_lease.lease.rules.report_stall`."""
        new, done = rules.report_stall(self._tick(fence.key), fence, self.now, stage, snapshot)
        self._keep(fence.key, new)
        return done

    async def cancel(self, key: str, reason: str) -> JobState | None:
        """:func:`ai_lease.lease.rules.cancel`."""
        new, job = rules.cancel(self._tick(key), self.now, reason)
        self._keep(key, new)
        return job

    async def submit(self, key: str, spec: str, fingerprint: str) -> JobState:
        """:func:`ai_lease.lease.rules.submit`."""
        new, job = rules.submit(self._tick(key), key, self.now, spec=spec, fingerprint=fingerprint)
        self._keep(key, new)
        return job

    async def retry(self, key: str) -> JobState | None:
        """:func:`ai_lease.lease.rules.retry`."""
        new, job = rules.retry(self._tick(key), self.now)
        self._keep(key, new)
        return job
