"""Budgets as frozen value objects: the library takes these, never the environment.

>>> StreamTimeouts(first_token=30, idle=15, total=300)
StreamTimeouts(first_token=30.0s, idle=15.0s, total=300.0s)

All durations are float seconds. A bad value raises :class:`ConfigError` naming the field.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Literal

from ai_lease.errors import ConfigError
from ai_lease.retry import RetryPolicy  # re-exported: the one retry value object lives there

__all__ = [
    "DEFAULT_STAGE_BUDGETS",
    "AdaptiveBudgets",
    "LeaseTimings",
    "RetryPolicy",
    "StageBudget",
    "StallPolicy",
    "StreamLimits",
    "StreamTimeouts",
]


class StallPolicy(enum.StrEnum):
    """What the keeper does once a job has stalled (no progress past its stage budget)."""

    EXPIRE = "expire"  # stop renewing and let the lease lapse (the seed's default)
    RELEASE = "release"  # step down at once: followers need not wait out the TTL
    ALERT = "alert"  # keep renewing; record and count only (a duplicate run is worse)


def _positive(owner: object, *names: str, allow_inf: bool = False) -> None:
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{type(owner).__name__}.{name}: must be a number of seconds")
        if math.isnan(value) or value <= 0 or (math.isinf(value) and not allow_inf):
            raise ConfigError(
                f"{type(owner).__name__}.{name}: must be a positive number of seconds "
                f"(got {value!r})"
            )
        object.__setattr__(owner, name, float(value))


def _seconds_repr(owner: object) -> str:
    parts = ", ".join(f"{f.name}={getattr(owner, f.name)}s" for f in fields(owner))  # type: ignore[arg-type]
    return f"{type(owner).__name__}({parts})"


@dataclass(frozen=True, repr=False)
class StageBudget:
    """A stage's budgets: the longest it may go without progress, and its hard deadline.

    >>> StageBudget(max_no_progress=90, deadline=300)
    StageBudget(max_no_progress=90.0s, deadline=300.0s)
    """

    max_no_progress: float
    deadline: float = math.inf

    def __post_init__(self) -> None:
        _positive(self, "max_no_progress")
        _positive(self, "deadline", allow_inf=True)

    __repr__ = _seconds_repr


# The seed's section 9 values; hard deadlines are generous multiples of them.
DEFAULT_STAGE_BUDGETS: dict[str, StageBudget] = {
    "validate": StageBudget(1.0, 10.0),
    "load": StageBudget(5.0, 60.0),
    "build_prompt": StageBudget(2.0, 20.0),
    "call_ai": StageBudget(90.0, 600.0),
    "parse": StageBudget(5.0, 60.0),
    "persist": StageBudget(10.0, 60.0),
}


@dataclass(frozen=True, repr=False)
class StreamTimeouts:
    """First-token, idle (between content deltas) and total budgets of one streamed call.

    ``idle_policy`` says what decides that a started stream went idle: ``"fixed"`` (the
    default), the ``idle`` budget alone; ``"phi"``, φ-accrual suspicion over the gaps
    between progress reaching ``phi_threshold`` (:mod:`ai_lease.observe.phi`), with ``idle``
    still the upper bound. Either way, φ crossing the threshold is reported once per stream.

    ``finish_grace`` is how long a stream may stay open once its finish reason has come
    (a buffering proxy holding the body, a usage chunk or ``[DONE]`` late): at most
    ``min(finish_grace, idle)`` later the answer is kept as it is (usage unknown if it had
    not come), never timed out. The answer is whole at the finish; the grace is only for
    the trailer.
    """

    first_token: float = 60.0
    idle: float = 30.0
    total: float = 600.0
    idle_policy: Literal["fixed", "phi"] = "fixed"
    phi_threshold: float = 8.0
    finish_grace: float = 2.0

    def __post_init__(self) -> None:
        _positive(self, "first_token", "idle", "total", allow_inf=True)
        _positive(self, "finish_grace")
        if self.idle_policy not in ("fixed", "phi"):
            raise ConfigError(
                f"StreamTimeouts.idle_policy: must be 'fixed' or 'phi' (got {self.idle_policy!r})"
            )
        threshold = self.phi_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigError("StreamTimeouts.phi_threshold: must be a number (φ, e.g. 8)")
        if not 0 < threshold < 1000:
            raise ConfigError(
                f"StreamTimeouts.phi_threshold: must be above 0 and below 1000 (got {threshold!r})"
            )
        object.__setattr__(self, "phi_threshold", float(threshold))

    def __repr__(self) -> str:
        seconds = f"first_token={self.first_token}s, idle={self.idle}s, total={self.total}s"
        if self.finish_grace != 2.0:
            seconds += f", finish_grace={self.finish_grace}s"
        if self.idle_policy == "fixed" and self.phi_threshold == 8.0:
            return f"StreamTimeouts({seconds})"
        return (
            f"StreamTimeouts({seconds}, idle_policy={self.idle_policy!r}, "
            f"phi_threshold={self.phi_threshold})"
        )


MiB = 1024 * 1024


@dataclass(frozen=True)
class StreamLimits:
    """How big one streamed answer may grow: one server-sent event, and the whole answer's
    text (UTF-8 bytes). Past either, the stream is closed with :class:`StreamLimitExceeded`.

    >>> StreamLimits(max_event_bytes=65536)
    StreamLimits(max_event_bytes=65536, max_answer_bytes=8388608)
    """

    max_event_bytes: int = 1 * MiB
    max_answer_bytes: int = 8 * MiB

    def __post_init__(self) -> None:
        for name in ("max_event_bytes", "max_answer_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"StreamLimits.{name}: must be a positive integer of bytes (got {value!r})"
                )


@dataclass(frozen=True)
class LeaseTimings:
    """How leases are held.

    ``renew_interval`` must leave room for a few renewals per TTL, and every store
    operation (``op_timeout``) must end before the next renewal is due; the first renewal
    must land before the self-fence point: ``renew_interval + op_timeout <
    ttl - self_fence_margin``.
    ``self_fence_margin`` is how long before its lease could lapse (on the local
    monotonic clock) an owner that cannot reach the store stops its own work.
    ``job_deadline`` bounds a job from its first acquisition; ``queue_deadline`` (off by
    default) bounds how long a submitted job may wait for that first acquisition.
    """

    ttl: float = 30.0
    renew_interval: float = 5.0
    op_timeout: float = 2.0
    poll_interval: float = 1.0
    stall_after_misses: int = 1
    stall_policy: StallPolicy = StallPolicy.EXPIRE
    self_fence_margin: float = 2.0
    job_deadline: float = 3600.0
    queue_deadline: float = math.inf
    stage_budgets: dict[str, StageBudget] = field(
        default_factory=lambda: dict(DEFAULT_STAGE_BUDGETS)
    )
    default_budget: StageBudget = StageBudget(60.0, 600.0)

    def __post_init__(self) -> None:
        _positive(self, "ttl", "renew_interval", "op_timeout", "poll_interval")
        _positive(self, "self_fence_margin", "job_deadline", "queue_deadline", allow_inf=True)
        if self.renew_interval * 2 > self.ttl:
            raise ConfigError(
                f"LeaseTimings.renew_interval: must be at most half of ttl so a late renewal "
                f"can still land (got {self.renew_interval:g}s with ttl {self.ttl:g}s)"
            )
        if self.op_timeout >= self.renew_interval:
            raise ConfigError(
                "LeaseTimings.op_timeout: must be shorter than renew_interval "
                f"(got {self.op_timeout:g}s with renew_interval {self.renew_interval:g}s)"
            )
        if self.self_fence_margin >= self.ttl:
            raise ConfigError(
                "LeaseTimings.self_fence_margin: must be shorter than ttl "
                f"(got {self.self_fence_margin:g}s with ttl {self.ttl:g}s)"
            )
        # The owner stops at ttl - self_fence_margin after sending its acquire; its first
        # renewal is sent renew_interval in and may take op_timeout to land.
        fence_after = self.ttl - self.op_timeout - self.self_fence_margin
        if self.renew_interval >= fence_after:
            raise ConfigError(
                "LeaseTimings.renew_interval: the first renewal would be due after the "
                f"self-fence point: renew_interval {self.renew_interval:g}s must be shorter "
                f"than ttl - op_timeout - self_fence_margin = {self.ttl:g} - "
                f"{self.op_timeout:g} - {self.self_fence_margin:g} = {fence_after:g}s "
                "(raise ttl or lower renew_interval)"
            )
        if isinstance(self.stall_after_misses, bool) or not (
            isinstance(self.stall_after_misses, int) and self.stall_after_misses >= 1
        ):
            raise ConfigError(
                f"LeaseTimings.stall_after_misses: must be an integer >= 1 "
                f"(got {self.stall_after_misses!r})"
            )
        try:
            object.__setattr__(self, "stall_policy", StallPolicy(self.stall_policy))
        except ValueError:
            raise ConfigError(
                "LeaseTimings.stall_policy: must be one of expire, release, alert "
                f"(got {self.stall_policy!r})"
            ) from None

    def budget(self, stage: str | None) -> StageBudget:
        """The budget in force for ``stage`` (the default budget for unknown stages)."""
        if stage is None:
            return self.default_budget
        return self.stage_budgets.get(stage, self.default_budget)


@dataclass(frozen=True)
class AdaptiveBudgets:
    """Learned budgets: once a stage has ``min_samples`` recorded durations, its
    ``max_no_progress`` becomes ``P99 x factor``, never below ``floor`` and never above the
    configured budget (the ceiling). Histograms are re-read every ``refresh_interval``."""

    factor: float = 1.5
    floor: float = 1.0
    min_samples: int = 200
    refresh_interval: float = 60.0

    def __post_init__(self) -> None:
        _positive(self, "factor", "floor", "refresh_interval")
        if isinstance(self.min_samples, bool) or not (
            isinstance(self.min_samples, int) and self.min_samples >= 1
        ):
            raise ConfigError(
                f"AdaptiveBudgets.min_samples: must be an integer >= 1 (got {self.min_samples!r})"
            )
