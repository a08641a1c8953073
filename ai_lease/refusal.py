"""Why a store refused a renewal or a fenced write: one code per reason, one message each.

The codes are what the Lua scripts return (``stores/redis/scripts.py``), what the pure rules return
(``rules.py``, run by SQLite), what :class:`~ai_lease.errors.FencingRejected` and
:class:`~ai_lease.errors.LeaseLost` carry, and what the metrics use as label values. The
English text comes from :data:`MESSAGES` alone, so rewording a message never changes a code.

>>> Refusal("not_owner").message
'another owner (or a newer token of this one) holds the lease'
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

__all__ = ["MESSAGES", "RENEWAL_REFUSALS", "WRITE_REFUSALS", "FenceLike", "Refusal"]


class Refusal(enum.StrEnum):
    """A store's reason for refusing a renewal (``renew``) or a fenced write (``commit``,
    ``fail``). The value is the stable code; :attr:`message` the English text."""

    MISSING = "missing"
    """No record for the job (renewal and write)."""
    NOT_OWNER = "not_owner"
    """Renewal: the fence is not the (token, owner) pair the store holds."""
    NOT_RUNNING = "not_running"
    """Renewal: the job is not RUNNING (released, cancelled or ended)."""
    EXPIRED = "expired"
    """Renewal: the lease lapsed before the renewal reached the store."""
    NO_PROGRESS = "no_progress"
    """Renewal: no progress within the stage budget plus grace (store clock)."""
    NEWER_OWNER = "newer_owner"
    """Write: the job runs under another (token, owner) pair."""
    ALREADY_COMMITTED = "already_committed"
    """Write: a commit met the result another owner committed."""
    ALREADY_FINISHED = "already_finished"
    """Write: the job already ended DONE or FAILED (and this is not its owner's repeat)."""
    CANCELLED = "cancelled"
    """Write: the job was cancelled by key."""

    @property
    def message(self) -> str:
        """What happened, in English (from :data:`MESSAGES`)."""
        return MESSAGES[self]


MESSAGES: Mapping[Refusal, str] = {
    Refusal.MISSING: "the store holds no record for this job",
    Refusal.NOT_OWNER: "another owner (or a newer token of this one) holds the lease",
    Refusal.NOT_RUNNING: "the job is no longer RUNNING (released, cancelled or ended)",
    Refusal.EXPIRED: "the lease had expired when the renewal reached the store",
    Refusal.NO_PROGRESS: "the store saw no progress within the stage budget and grace",
    Refusal.NEWER_OWNER: "a newer owner took the job over",
    Refusal.ALREADY_COMMITTED: "another owner already committed its result",
    Refusal.ALREADY_FINISHED: "the job already ended DONE or FAILED",
    Refusal.CANCELLED: "the job already ended CANCELLED",
}
"""The one place a refusal's English text is written."""

RENEWAL_REFUSALS = (
    Refusal.MISSING,
    Refusal.NOT_OWNER,
    Refusal.NOT_RUNNING,
    Refusal.EXPIRED,
    Refusal.NO_PROGRESS,
)
"""What ``renew`` may answer (the RENEW script, :func:`ai_lease.lease.rules.renew`)."""

WRITE_REFUSALS = (
    Refusal.MISSING,
    Refusal.NEWER_OWNER,
    Refusal.ALREADY_COMMITTED,
    Refusal.ALREADY_FINISHED,
    Refusal.CANCELLED,
)
"""Why ``commit``/``fail`` raise FencingRejected (the FINISH script, ``rules.finish``)."""


class FenceLike(Protocol):
    """A fence as a refusal names it (the one held, the one the store holds):
    :class:`ai_lease.lease.Fence` is the one passed. Named by its shape here, beside the
    codes, so the error tree needs nothing of the lease room above it."""

    @property
    def key(self) -> str: ...
    @property
    def owner_id(self) -> str: ...
    @property
    def token(self) -> int: ...
