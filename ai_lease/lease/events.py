"""What a run reports as it goes: acquired, following, renewed, stalled, committed, fenced…

Events are for people and dashboards (the CLI's live view, the demo's timeline, history
files, metrics). They are emitted per lease operation and per stage, never per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventSink"]


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to one job.

    ``kind`` is one of: ``acquired``, ``takeover``, ``following``, ``stage``, ``stage_done``
    (``value``: seconds), ``first_token`` (``value``: seconds to the first progress: text,
    reasoning or tool-call arguments), ``first_visible`` (``value``: seconds to the first
    answer text),
    ``stream_timeout`` (``detail``: which), ``model_call`` (``attrs``: chunks, token
    counts, finish reason), ``answer_capped`` (the answer stopped at max_tokens),
    ``renewed`` (``value``: progress events since the last renewal), ``renew_skipped``
    (no progress within budget), ``renew_refused``,
    ``renew_failed`` (store unreachable), ``stalled``, ``self_fenced``, ``released``,
    ``committed`` (``value``: seconds from acquiring to committing), ``commit_late`` (a
    commit whose answer never came was applied after all), ``fenced`` (a write
    rejected), ``retry``, ``done``, ``failed``, ``store_corrupt`` (a stored value that is not
    ours was skipped: ``detail`` names it), ``terminated`` (a signal sent to the job's child
    process: ``attrs`` signal ``"term"``/``"kill"``, pid), ``reaped`` (the child collected:
    ``detail`` the ladder's outcome, ``attrs`` exit_code), ``child_audit`` (what the kill
    left behind), ``slot_wait`` (a model call waits for a provider slot: ``attrs`` limit,
    ahead), ``slot_taken`` (``value``: seconds waited), ``slot_released``, ``rate_limited``
    (a 429 under a limit: ``attrs`` limit, and paused: the seconds the limit was paused for,
    also ``value``, when the 429 gave a retry hint), ``rate_spent`` (a success's rate-limit
    headers said the provider's limit is spent: ``attrs`` limit, paused, also ``value``, the
    seconds it was paused for), ``limit_adapted`` (an adaptive limit's
    concurrency in this process changed: ``value`` the new one, ``attrs`` limit); workers add
    ``worker_*`` and ``job_*`` kinds, and ``loop_blocked`` (``idle_s``: seconds the event loop
    ran nothing, ``detail``: the loop thread's stack) and ``loop_resumed``
    (:mod:`ai_lease.observe.loop_watchdog`).
    """

    kind: str
    key: str
    owner_id: str | None = None
    token: int | None = None
    stage: str | None = None
    idle_s: float | None = None
    detail: str = ""
    at: float = field(default_factory=time.time)
    value: float | None = None
    attrs: Mapping[str, float | int | str] | None = None  # e.g. token counts of a model call

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


EventSink = Callable[[Event], None]
