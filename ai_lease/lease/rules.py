"""The lease rules as pure functions: (record, store time, request) -> (new record, answer).

The SQLite store runs these inside one transaction; the Redis store's Lua scripts
(``stores/redis/scripts.py``) are the same rules, line for line, and the contract suite holds both
to them. ``None`` as the new record means "write nothing". A refusal is a
:class:`~ai_lease.refusal.Refusal` member, the code the scripts return for it.

Fencing tokens are ``max(previous + 1, store time in microseconds)``: strictly increasing
per key while the record lives, and still increasing after the store lost every record,
because the store's clock has moved on since any token was issued.
"""

from __future__ import annotations

from typing import Any

from ai_lease.errors import FencingRejected, JobConflict
from ai_lease.failure import FailureKind, kept_kind, render, stored_error
from ai_lease.job import JobState, RunFacts, Status
from ai_lease.lease.base import (
    Acquired,
    AcquireOutcome,
    Fence,
    Finished,
    Following,
    Renewal,
)
from ai_lease.lease.storable import diagnostic
from ai_lease.refusal import Refusal

__all__ = ["acquire", "cancel", "commit", "fail", "release", "renew", "report_stall", "submit"]

Change = JobState | None


def next_token(previous: int, now: float) -> int:
    return max(previous + 1, int(now * 1_000_000))


def clip(text: str | None) -> str | None:
    """An error text or snapshot as every store keeps it: clipped and storable
    (:func:`~ai_lease.lease.storable.diagnostic`)."""
    return diagnostic(text)


def node_of(owner_id: str) -> str:
    """The node part of an owner id (``<node_id>#<n>.<random>``: before the last ``#``)."""
    return owner_id.rpartition("#")[0] or owner_id


def takeover_cause(rec: JobState, owner_id: str) -> str | None:
    """Why ``owner_id`` acquiring ``rec`` is a takeover, or None when it is not one (no
    earlier owner, or the same node retrying): ``stalled`` (the last attempt stalled),
    ``released`` (handed back) or ``expired`` (its lease lapsed)."""
    if rec.owner_id is None or node_of(rec.owner_id) == node_of(owner_id):
        return None
    if rec.stalled_attempt and rec.stalled_attempt == rec.attempts:
        return "stalled"
    return "released" if rec.status is Status.PENDING else "expired"


def _errored(rec: JobState, error: str | None) -> dict[str, Any]:
    """The fields that say ``error`` (None: keep the old one) came from ``rec``'s attempt."""
    if error is None:
        return {}
    return {
        "last_error": clip(error),
        "last_error_attempt": rec.attempts,
        "last_error_owner": rec.owner_id,
    }


def acquire(
    rec: JobState | None,
    key: str,
    owner_id: str,
    now: float,
    *,
    ttl: float,
    max_no_progress: float,
    stall_policy: str,
    fingerprint: str | None,
    max_attempts: int | None,
    renew_interval: float | None = None,
) -> tuple[Change, AcquireOutcome]:
    if rec is not None:
        if fingerprint and rec.fingerprint and rec.fingerprint != fingerprint:
            raise JobConflict(key)
        if rec.status.terminal:
            return None, Finished(rec)
        if rec.status is Status.RUNNING and (rec.lease_expires_at or 0) > now:
            if rec.owner_id == owner_id:  # a repeated acquire (e.g. after a lost reply)
                return None, Acquired(Fence.of(rec), False, rec)
            return None, Following(rec)
    base = rec or JobState(key=key, status=Status.PENDING, created_at=now)
    if max_attempts is not None and base.attempts >= max_attempts:
        done = _gave_up(base, now, fingerprint)
        return done, Finished(done)
    cause = takeover_cause(base, owner_id)
    more: dict[str, Any] = {"renew_interval": renew_interval}
    if cause is not None:
        more.update(takeovers=base.takeovers + 1, takeover_cause=cause)
    new = _granted(base, owner_id, now, ttl, max_no_progress, stall_policy, fingerprint, more)
    return new, Acquired(Fence.of(new), cause is not None, new, cause)


def _gave_up(base: JobState, now: float, fingerprint: str | None) -> JobState:
    """The record of a job out of attempts: FAILED, naming the last error."""
    return base.evolve(
        status=Status.FAILED,
        failure_kind=FailureKind.GAVE_UP.value,  # the record says so; readers see the sentence
        last_error=render(FailureKind.GAVE_UP, base.attempts, base.last_error),
        lease_expires_at=None,
        checkpoint=None,
        updated_at=now,
        read_at=now,
        fingerprint=base.fingerprint or fingerprint,
    )


def _granted(
    base: JobState,
    owner_id: str,
    now: float,
    ttl: float,
    max_no_progress: float,
    stall_policy: str,
    fingerprint: str | None,
    more: dict[str, Any],
) -> JobState:
    """The record of a new lease for ``owner_id``: RUNNING under a fresh token (and ``more``)."""
    return base.evolve(
        status=Status.RUNNING,
        owner_id=owner_id,
        token=next_token(base.token, now),
        stage=None,
        progress_version=0,
        heartbeat_at=now,
        last_progress_at=now,
        lease_expires_at=now + ttl,
        max_no_progress=max_no_progress,
        stall_policy=stall_policy,
        attempts=base.attempts + 1,
        started_at=now if base.started_at is None else base.started_at,
        fingerprint=base.fingerprint or fingerprint,
        updated_at=now,
        read_at=now,
        **more,
    )


def _refusal(rec: JobState | None, fence: Fence, now: float) -> Refusal | None:
    if rec is None:
        return Refusal.MISSING
    if not fence.holds(rec):
        return Refusal.NOT_OWNER
    if rec.status is not Status.RUNNING:
        return Refusal.NOT_RUNNING
    if (rec.lease_expires_at or 0) <= now:
        return Refusal.EXPIRED
    return None


def renew(
    rec: JobState | None,
    fence: Fence,
    now: float,
    *,
    ttl: float,
    stage: str | None,
    progress_version: int,
    max_no_progress: float,
    grace: float,
    checkpoint: str | None = None,
) -> tuple[Change, Renewal]:
    """Extend the lease (the RENEW script); a ``checkpoint`` is stored only with a granted
    renewal (None keeps the stored one)."""
    refused = _refusal(rec, fence, now)
    if rec is None or refused:
        current = None if rec is None else Fence.of(rec)
        return None, Renewal(False, refused, current=current)
    last_progress = rec.last_progress_at or now
    version = rec.progress_version
    if progress_version > version:
        version, last_progress = progress_version, now
    changes: dict[str, Any] = {
        "stage": stage,
        "max_no_progress": max_no_progress,
        "renew_interval": grace,  # the keeper's grace is its renew interval
        "progress_version": version,
        "last_progress_at": last_progress,
        "updated_at": now,
        "read_at": now,
    }
    stalled = now - last_progress > max_no_progress + grace
    if stalled:
        changes.update(missed_renewals=rec.missed_renewals + 1, stalled_attempt=rec.attempts)
        if rec.stall_policy != "alert":
            remaining = max(0.0, (rec.lease_expires_at or now) - now)
            return rec.evolve(**changes), Renewal(
                False, Refusal.NO_PROGRESS, remaining, current=fence
            )
    changes.update(heartbeat_at=now, lease_expires_at=now + ttl)
    if checkpoint is not None:
        changes["checkpoint"] = checkpoint
    renewed = rec.evolve(**changes)
    return renewed, Renewal(True, None, ttl, stalled=stalled)


def release(
    rec: JobState | None,
    fence: Fence,
    now: float,
    *,
    error: str | None,
    snapshot: str | None,
    interrupted: bool = False,
) -> tuple[Change, bool]:
    if _refusal(rec, fence, now) not in (None, Refusal.EXPIRED) or rec is None:
        return None, False
    marks = _errored(rec, error)
    if snapshot is not None:  # a stall snapshot: this attempt stalled
        marks["stalled_attempt"] = rec.attempts
    new = rec.evolve(
        **marks,
        # An interrupted owner (cancelled, not failed) gives its attempt back.
        attempts=max(0, rec.attempts - 1) if interrupted else rec.attempts,
        status=Status.PENDING,
        lease_expires_at=now,
        updated_at=now,
        read_at=now,
        stall_snapshot=clip(snapshot) if snapshot is not None else rec.stall_snapshot,
    )
    return new, True


def _reject(rec: JobState | None, fence: Fence, refusal: Refusal) -> FencingRejected:
    current = None if rec is None or rec.owner_id is None else Fence.of(rec)
    return FencingRejected(fence.key, fence, current, refusal)


def _ended_refusal(rec: JobState, status: Status) -> Refusal:
    """Why a write meets a job that has already ended (the FINISH script's ``why``)."""
    if rec.status is Status.CANCELLED:
        return Refusal.CANCELLED
    if rec.status is Status.DONE and status is Status.DONE:
        return Refusal.ALREADY_COMMITTED
    return Refusal.ALREADY_FINISHED


def finish(
    rec: JobState | None,
    fence: Fence,
    now: float,
    status: Status,
    value: str,
    finish_reason: str | None = None,
    facts: RunFacts | None = None,
    kind: str | None = None,
) -> tuple[Change, JobState]:
    """End the job DONE (``value`` is the result) or FAILED (``value`` is the reason), fenced,
    with ``facts`` (what ran) and ``finished_at``; the same call repeated by the same owner
    returns the stored record (the FINISH script)."""
    if rec is None:
        raise _reject(rec, fence, Refusal.MISSING)
    mine = fence.holds(rec)
    if rec.status.terminal:
        if mine and rec.status is status:  # repeated after a lost reply: the stored record
            return None, rec
        raise _reject(rec, fence, _ended_refusal(rec, status))
    if not mine:
        raise _reject(rec, fence, Refusal.NEWER_OWNER)
    # A DONE record's stage is final ("done"); a FAILED one keeps the stage it failed in.
    done = status is Status.DONE
    field: dict[str, Any] = (
        {"result": value, "stage": "done", "finish_reason": finish_reason or None}
        if done
        else {**_errored(rec, value), "failure_kind": kept_kind(kind, value)}
    )
    field.update(_facts(rec, facts))
    new = rec.evolve(
        status=status,
        lease_expires_at=None,
        updated_at=now,
        read_at=now,
        finished_at=now,
        checkpoint=None,  # the result (or the failure) ends any resumable stream
        **field,
    )
    return new, new


def _facts(rec: JobState, facts: RunFacts | None) -> dict[str, Any]:
    """The record's fields for ``facts`` (the FINISH script's: a fact not given is kept)."""
    if facts is None:
        return {}
    given = {
        "provider": facts.provider or None,
        "model": facts.model or None,
        "prompt_tokens": facts.prompt_tokens,
        "completion_tokens": facts.completion_tokens,
        "reasoning_tokens": facts.reasoning_tokens,
        "first_token_s": facts.first_token_s,
        "first_visible_s": facts.first_visible_s,
        "stage_durations": facts.durations_json(),
    }
    return {name: value for name, value in given.items() if value is not None}


def commit(
    rec: JobState | None,
    fence: Fence,
    now: float,
    result: str,
    finish_reason: str | None = None,
    facts: RunFacts | None = None,
) -> tuple[Change, JobState]:
    return finish(rec, fence, now, Status.DONE, result, finish_reason, facts)


def fail(
    rec: JobState | None,
    fence: Fence,
    now: float,
    reason: str,
    facts: RunFacts | None = None,
    kind: str | None = None,
) -> tuple[Change, JobState]:
    return finish(rec, fence, now, Status.FAILED, reason, facts=facts, kind=kind)


def cancel(rec: JobState | None, now: float, reason: str) -> tuple[Change, JobState | None]:
    """End a job CANCELLED (the CANCEL script): not fenced, it needs no lease. Its owner,
    if any, keeps its pair in the record, but the status is terminal: its next renewal is
    refused (``not_running``) and its commit rejected. A finished job stays as it is (its
    record is returned); an unknown key gives None."""
    if rec is None or rec.status.terminal:
        return None, rec
    new = rec.evolve(
        status=Status.CANCELLED,
        lease_expires_at=None,
        checkpoint=None,
        last_error_attempt=None,
        last_error_owner=None,
        last_error=clip(reason),
        updated_at=now,
        read_at=now,
    )
    return new, new


def report_stall(
    rec: JobState | None, fence: Fence, now: float, stage: str | None, snapshot: str
) -> tuple[Change, bool]:
    if rec is None or not fence.holds(rec) or rec.status.terminal:
        return None, False
    new = rec.evolve(
        **_errored(rec, snapshot.split("\n", 1)[0]),
        stalled_attempt=rec.attempts,
        stall_snapshot=clip(snapshot),
        stage=stage,
        updated_at=now,
        read_at=now,
    )
    return new, True


def submit(
    rec: JobState | None, key: str, now: float, *, spec: str, fingerprint: str
) -> tuple[Change, JobState]:
    """Record a job for workers (PENDING with its spec), or return the one already there."""
    if rec is not None:
        if rec.fingerprint and rec.fingerprint != fingerprint:
            raise JobConflict(key)
        if rec.spec is not None:
            return None, rec
        new = rec.evolve(spec=spec, fingerprint=fingerprint, updated_at=now, read_at=now)
        return new, new
    new = JobState(
        key=key,
        status=Status.PENDING,
        spec=spec,
        fingerprint=fingerprint,
        created_at=now,
        updated_at=now,
        read_at=now,
    )
    return new, new


# -- the jobs' lifecycle for people: retry, remove, prune (ai-lease retry / rm / prune) -------

RETRYABLE = frozenset({Status.FAILED, Status.CANCELLED})
"""The statuses :func:`retry` sends back to PENDING."""


def retry(rec: JobState | None, now: float) -> tuple[Change, JobState | None]:
    """A FAILED or CANCELLED job back to PENDING with a fresh attempt budget (the RETRY
    script): attempts 0, no owner (the last owner's fence no longer holds, so its late
    commit is rejected, and the next acquire is no takeover), the token kept (the next one
    is higher), and its queue and job deadlines restarted (``created_at`` now, no
    ``started_at``). Any other job is returned unchanged; an unknown key gives None."""
    if rec is None or rec.status not in RETRYABLE:
        return None, rec
    new = rec.evolve(
        status=Status.PENDING,
        attempts=0,
        owner_id=None,
        failure_kind=None,  # the last error stays as stored, without its verdict
        last_error=stored_error(rec.failure_kind, rec.attempts, rec.last_error),
        checkpoint=None,  # a new run starts afresh
        lease_expires_at=None,
        started_at=None,
        created_at=now,
        updated_at=now,
        read_at=now,
    )
    return new, new


def removable(rec: JobState, now: float, *, force: bool) -> bool:
    """Whether :func:`remove` may delete ``rec``: anything but a RUNNING job whose lease is
    live, unless forced (the REMOVE script)."""
    live = rec.status is Status.RUNNING and (rec.lease_expires_at or 0) > now
    return force or not live


def prunable(rec: JobState, cutoff: float, statuses: frozenset[str]) -> bool:
    """Whether ``prune`` deletes ``rec``: one of ``statuses`` (terminal ones), last
    written before ``cutoff`` (store clock; the PRUNE script)."""
    written = rec.updated_at or rec.created_at
    return rec.status.terminal and rec.status.value in statuses and written < cutoff
