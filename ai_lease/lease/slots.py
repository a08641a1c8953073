"""Provider slots: a named limit (``"openai:gpt-4o-mini"``) of ``capacity`` slots that
callers take in turn, each held under a lease a zombie cannot keep.

A store with slots (:class:`SlotStore`) answers each operation atomically (one Lua script on
Redis, one function call on PostgreSQL, one write transaction on SQLite), judging time by its
own clock:

``acquire_slot``  -> :class:`SlotGrant` (a slot is yours: its :class:`SlotFence`, a token
                   from the limit's own counter, and when it lapses unless renewed)
                   | :class:`SlotWait` (all taken, or others wait before you: how many)
``renew_slot``    the holder's lease goes on (False: it lapsed, or the fence is stale)
``release_slot``  fenced: a stale fence frees nothing; a freed slot wakes the waiters
``leave_slot``    a caller that gave up: its place in line and any slot it holds go
``slot_state``    how many slots are in use and how many callers wait (:class:`SlotState`)
``wait_slot``     return on the limit's next release (or after a timeout): no polling storm
``pause_slot``    no slot is granted for the next ``seconds`` (a provider's 429 said to wait)
``reweigh_slot``  a weighted slot's units, set again (a request's tokens, known at its end)

**Weighted slots.** A caller may ask for ``weight`` units of a limit in place of one slot (a
tokens-per-minute window: ``capacity`` tokens, a request's estimate as its weight). The units
in use are then the sum of the live holders' weights; a weighted caller is granted only when
it is first in line and its weight fits, so a large request is not passed by small ones.

Waiters are served first come, first served per limit (a higher ``priority`` first, then
arrival). A waiter keeps its place only while it keeps asking: its entry lapses
``wait_ttl`` after its last ask, so a waiter that died never blocks the line. A holder whose
lease lapsed (``ttl`` passed without a renewal) is reclaimed by the next acquire. Asking again
with the same owner id is safe (a lost reply): a holder gets its own slot back, renewed, and a
waiter keeps its place.

A paused limit (``pause_slot``: a 429 with a retry hint, seen by any caller) grants nothing
until the pause ends, to anyone: waiters keep their places and hear how long is left
(:attr:`SlotWait.paused`); slots already held stay held. Pausing again keeps the later end.

The errors a slot's holder meets sit in the one tree (:mod:`ai_lease.errors`):
:class:`SlotLost` is a :class:`~ai_lease.errors.LeaseError`, :class:`SlotWaitTimeout` a
:class:`~ai_lease.errors.StageTimeout`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ai_lease.errors import InputError, LeaseError, StageTimeout

__all__ = [
    "MAX_CAPACITY",
    "MAX_UNITS",
    "PAUSE_RANGE",
    "WAIT_TTL",
    "SlotFence",
    "SlotGrant",
    "SlotLost",
    "SlotOutcome",
    "SlotState",
    "SlotStopped",
    "SlotStore",
    "SlotWait",
    "SlotWaitTimeout",
    "check_limit",
    "check_pause",
    "check_slot_args",
    "check_weight",
]

MAX_CAPACITY = 10_000
"""The most slots one limit may have."""

MAX_UNITS = 1_000_000_000
"""The most units a weighted limit may have (tokens per minute)."""

MAX_LIMIT_CHARS = 200
"""The longest limit name."""

PRIORITIES = range(-100, 101)
"""The priorities a waiter may ask with (higher is served first)."""

WAIT_TTL = 3.0
"""Seconds a waiter's place in line lasts after its last ask (callers ask every third)."""

PAUSE_RANGE = (0.001, 3_600.0)
"""How long one pause may be (seconds)."""

TTL_RANGE = (0.1, 86_400.0)
WAIT_TTL_RANGE = (0.05, 60.0)

_LIMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+~%=-]*")


def check_limit(limit: str) -> str:
    """``limit`` if it can name a limit (1 to :data:`MAX_LIMIT_CHARS` characters: ASCII
    letters and digits, then also ``. _ : / @ + ~ % = -``), else :class:`InputError`.

    >>> check_limit("openai:gpt-4o-mini")
    'openai:gpt-4o-mini'
    """
    if isinstance(limit, str) and len(limit) <= MAX_LIMIT_CHARS and _LIMIT.fullmatch(limit):
        return limit
    shown = repr(limit) if not isinstance(limit, str) or len(limit) <= 80 else repr(limit[:60])
    raise InputError(
        f"limit name {shown} is invalid: use 1 to {MAX_LIMIT_CHARS} characters, ASCII letters "
        "and digits first, then also . _ : / @ + ~ % = - (e.g. 'openai:gpt-4o-mini')"
    )


def check_slot_args(
    limit: str,
    *,
    capacity: int,
    ttl: float,
    priority: int = 0,
    wait_ttl: float = WAIT_TTL,
    weight: int | None = None,
) -> str:
    """The checked limit name; an :class:`InputError` naming the first bad value. A weighted
    ask (``weight``) may have up to :data:`MAX_UNITS` units, and a weight of ``capacity`` at
    most (more could never be granted)."""
    limit = check_limit(limit)
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise InputError(f"slot {limit!r}: capacity must be an int, not {capacity!r:.40}")
    top = MAX_CAPACITY if weight is None else MAX_UNITS
    if not 1 <= capacity <= top:
        raise InputError(f"slot {limit!r}: capacity {capacity} is not in 1..{top}")
    if weight is not None:
        check_weight(limit, weight, capacity)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise InputError(f"slot {limit!r}: priority {priority!r:.40} is not an int in -100..100")
    check_seconds(limit, "ttl", ttl, *TTL_RANGE)
    check_seconds(limit, "wait_ttl", wait_ttl, *WAIT_TTL_RANGE)
    return limit


def check_weight(limit: str, weight: int, capacity: int = MAX_UNITS) -> int:
    """``weight`` if it is a weight of 1 to ``capacity`` units, else :class:`InputError`."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= capacity:
        raise InputError(f"slot {limit!r}: weight {weight!r:.40} is not an int in 1..{capacity}")
    return weight


def check_pause(limit: str, seconds: float) -> float:
    """``seconds`` if a limit may be paused that long (:data:`PAUSE_RANGE`), else
    :class:`InputError`."""
    return check_seconds(check_limit(limit), "pause", seconds, *PAUSE_RANGE)


def check_seconds(limit: str, name: str, value: float, low: float, high: float) -> float:
    """``value`` if it is a number of seconds in ``low..high``, else :class:`InputError`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"slot {limit!r}: {name} must be a number of seconds, not {value!r:.40}")
    if not low <= value <= high:
        raise InputError(f"slot {limit!r}: {name} {value:g}s is not in {low:g}..{high:g}s")
    return float(value)


@dataclass(frozen=True, slots=True)
class SlotFence:
    """What a slot's holder presents to renew or release it: the limit and its (token,
    owner id) pair. Tokens come from the limit's own counter, increasing.

    >>> str(SlotFence("openai:gpt-4o-mini", "a", 7))
    "slot token 7 of 'a' on 'openai:gpt-4o-mini'"
    """

    limit: str
    owner_id: str
    token: int

    def __str__(self) -> str:
        return f"slot token {self.token} of {self.owner_id!r} on {self.limit!r}"


@dataclass(frozen=True, slots=True)
class SlotGrant:
    """A slot is the caller's until ``expires_at`` (store clock, read at ``read_at``)."""

    fence: SlotFence
    expires_at: float
    read_at: float

    @property
    def lease_remaining(self) -> float:
        return max(0.0, self.expires_at - self.read_at)


@dataclass(frozen=True, slots=True)
class SlotWait:
    """No slot yet: ``ahead`` waiters come first, ``in_use`` slots are taken, and the limit
    stays paused ``paused`` seconds more (0: not paused)."""

    ahead: int
    in_use: int
    paused: float = 0.0


SlotOutcome = SlotGrant | SlotWait


@dataclass(frozen=True, slots=True)
class SlotState:
    """A limit as the store holds it: live slots taken (units, for weighted holders),
    callers waiting (store clock)."""

    limit: str
    in_use: int
    waiting: int


@runtime_checkable
class SlotStore(Protocol):
    """A store that keeps provider slots (every built-in store): see the module docstring."""

    async def acquire_slot(
        self,
        limit: str,
        owner_id: str,
        *,
        capacity: int,
        ttl: float,
        priority: int = 0,
        wait_ttl: float = WAIT_TTL,
        weight: int | None = None,
    ) -> SlotOutcome: ...

    async def renew_slot(self, fence: SlotFence, ttl: float) -> bool: ...

    async def release_slot(self, fence: SlotFence) -> bool:
        """Free the slot ``fence`` holds (True); a stale or lapsed fence frees nothing."""
        ...

    async def leave_slot(self, limit: str, owner_id: str) -> None:
        """``owner_id`` gave up: its place in line goes, and any slot it holds."""
        ...

    async def slot_state(self, limit: str) -> SlotState: ...

    async def wait_slot(self, limit: str, timeout: float, *, ahead: int = 0) -> None:
        """Return on the limit's next release or after ``timeout`` (may return early);
        ``ahead``, the waiters before this one, lets a polling store look less often."""
        ...

    async def reweigh_slot(self, fence: SlotFence, weight: int) -> bool:
        """Set the units ``fence``'s live slot takes to ``weight`` (False: it lapsed, or the
        fence is stale); fewer units wake the waiters."""
        ...

    async def pause_slot(self, limit: str, seconds: float) -> float:
        """Grant no slot of ``limit`` for ``seconds`` from now (a later end already set is
        kept): the seconds the pause now lasts."""
        ...


class SlotLost(LeaseError):
    """A slot's lease is gone (a renewal refused, or none landed in time): the work that
    held it was cancelled, so a zombie cannot keep it."""

    def __init__(self, fence: SlotFence, reason: str) -> None:
        self.limit, self.fence, self.reason = fence.limit, fence, reason
        super().__init__(
            f"slot of {fence.limit!r} (token {fence.token}) lost: {reason}; the block was "
            "cancelled (give the slot a longer ttl if the store is slow to answer)"
        )


class SlotWaitTimeout(StageTimeout):
    """No slot of ``limit`` came free within ``max_wait`` (``budget_s``) seconds."""

    def __init__(self, limit: str, waited_s: float, budget_s: float, ahead: int) -> None:
        self.limit, self.waited_s, self.budget_s, self.ahead = limit, waited_s, budget_s, ahead
        super().__init__(
            f"no slot of {limit!r} came free in {waited_s:.2f}s (max_wait {budget_s:g}s; "
            f"{ahead} still ahead): raise max_wait or the limit's capacity"
        )


class SlotStopped(StageTimeout):
    """A model call of a job stopped because of its slot: the call made no progress within
    its budget (the slot was given back to the next waiter), or the slot was lost. The job
    is tried again, like any other timeout."""

    def __init__(self, limit: str, reason: str, budget_s: float) -> None:
        self.limit, self.reason, self.budget_s = limit, reason, budget_s
        super().__init__(f"the model call's slot of {limit!r} was given up: {reason}")
