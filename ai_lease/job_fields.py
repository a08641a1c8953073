"""How each stored job field is checked and converted (:meth:`JobState.from_fields`).

The stores hold text (Redis hashes) or JSON values (SQLite's record); each field has a
kind, and each kind a function that turns the stored value into the record's value or
raises ``TypeError``/``ValueError`` for a value of the wrong type. The ``status`` kind is
converted by :mod:`ai_lease.job` itself (it owns :class:`~ai_lease.job.Status`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["FIELD_KINDS", "KIND_CONVERTERS", "KIND_SAME_TYPE"]

FIELD_KINDS: dict[str, str] = {
    "status": "status",
    "owner_id": "str",
    "token": "int",
    "stage": "str",
    "progress_version": "int",
    "heartbeat_at": "time",
    "last_progress_at": "time",
    "lease_expires_at": "time",
    "max_no_progress": "time",
    "renew_interval": "time",
    "stall_policy": "policy",
    "attempts": "int",
    "takeovers": "int",
    "takeover_cause": "str",
    "stalled_attempt": "int",
    "missed_renewals": "int",
    "last_error": "str",
    "failure_kind": "str",
    "last_error_attempt": "count",
    "last_error_owner": "str",
    "stall_snapshot": "str",
    "fingerprint": "str",
    "spec": "str",
    "result": "str",
    "created_at": "time0",
    "updated_at": "time0",
    "started_at": "time",
    "finish_reason": "str",
    "finished_at": "time",
    "provider": "str",
    "model": "str",
    "prompt_tokens": "count",
    "completion_tokens": "count",
    "reasoning_tokens": "count",
    "first_token_s": "time",
    "first_visible_s": "time",
    "stage_durations": "json",
    "checkpoint": "str",
}


def _policy(value: Any) -> str:
    if value is None or value == "":
        return "expire"
    if value not in ("expire", "release", "alert"):
        raise ValueError(value)
    return str(value)


def _str(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if value.__class__ is not str:
        raise TypeError(value)
    return str(value)


def _int(value: Any) -> int:
    if isinstance(value, float | bool):
        raise TypeError(value)
    return 0 if value is None or value == "" else int(value)


def _count(value: Any) -> int | None:
    """An optional count: None when unset."""
    if isinstance(value, float | bool):
        raise TypeError(value)
    return None if value is None or value == "" else int(value)


def _json(value: Any) -> str | None:
    """A JSON object field: stored as text (Redis) or as the object itself (SQLite's
    record is JSON); kept as its text, checked to be an object."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    if value.__class__ is not str or not isinstance(orjson.loads(value), dict):
        raise TypeError(value)
    return str(value)


def _time(value: Any) -> float | None:
    if isinstance(value, bool):
        raise TypeError(value)
    return None if value is None or value == "" else float(value)


def _time0(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(value)
    return 0.0 if value is None or value == "" else float(value)


# Each kind but ``status`` with the function that checks and converts it.
KIND_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "policy": _policy,
    "str": _str,
    "int": _int,
    "count": _count,
    "json": _json,
    "time": _time,
    "time0": _time0,
}

# For a kind here, its function returns a value of exactly this type (a non-empty one, for
# ``str``) as it is: :meth:`~ai_lease.job.JobState.from_fields` takes such a value without
# the call. Keep it in step with the functions above (tests/test_job_decode.py checks).
KIND_SAME_TYPE: dict[str, type] = {
    "str": str,
    "int": int,
    "count": int,
    "time": float,
    "time0": float,
}
