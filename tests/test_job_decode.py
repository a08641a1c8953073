"""JobState's fast paths (decoding stored fields, building records) give what the plain ones
give: the same record, field for field and type for type, and the same error for a bad value."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from ai_lease.errors import CorruptRecord
from ai_lease.failure import render
from ai_lease.job import JobState, Status
from ai_lease.job_fields import FIELD_KINDS, KIND_CONVERTERS, KIND_SAME_TYPE

READ_AT = 1_764_780_000.5

# Every kind of value a store (or a hostile writer) could leave in a field.
VALUES: list[Any] = [
    None,
    "",
    "0",
    "3",
    "-7",
    "3.5",
    "1e400",
    "nan",
    "x",
    "RUNNING",
    "FAILED",
    "expire",
    "alert",
    "bogus",
    "\x00",
    '{"a": 1}',
    "[1]",
    b"",
    b"12",
    b"DONE",
    b"\xff\xfe",
    0,
    3,
    -1,
    1 << 70,
    0.0,
    2.5,
    float("nan"),
    float("inf"),
    True,
    False,
    [],
    [1],
    {},
    {"a": 1.5},
]


def _plain(key: str, data: dict[str, Any], read_at: float) -> JobState:
    """``from_fields`` as it was: every field through its kind's function, then ``cls(**kw)``."""
    kwargs: dict[str, Any] = {"key": key, "read_at": read_at}
    name = value = None
    try:
        for name, kind in FIELD_KINDS.items():
            value = data.get(name)
            if value.__class__ is bytes:
                value = value.decode()
            if kind == "status":
                kwargs[name] = None if value is None or value == "" else Status(value)
            else:
                kwargs[name] = KIND_CONVERTERS[kind](value)
    except (TypeError, ValueError, UnicodeDecodeError):
        raise CorruptRecord(key, f"field {name!r} holds {str(value)[:40]!r}") from None
    if kwargs["status"] is None:
        raise CorruptRecord(key, "no status field")
    if kwargs["status"] is not Status.FAILED:
        kwargs["failure_kind"] = None
    elif kwargs["failure_kind"] is not None:
        kwargs["last_error"] = render(
            kwargs["failure_kind"], kwargs["attempts"], kwargs["last_error"]
        )
    return JobState(**kwargs)


def _outcome(build: Any, data: dict[str, Any]) -> Any:
    try:
        job = build("k", data, READ_AT)
    except CorruptRecord as exc:
        return ("error", str(exc))
    fields = [(n, type(v), repr(v)) for n, v in job.__dict__.items()]
    return ("job", fields, repr(job))


@pytest.mark.parametrize("name", list(FIELD_KINDS))
def test_every_value_in_every_field_decodes_as_before(name: str) -> None:
    for status, value in itertools.product(("RUNNING", "FAILED"), VALUES):
        data = {"status": status, "failure_kind": "gave_up", "attempts": "2", name: value}
        assert _outcome(JobState.from_fields, data) == _outcome(_plain, data), (name, value)


def test_a_whole_record_decodes_as_before_in_field_order() -> None:
    data = {
        "status": "DONE",
        "owner_id": "n#1.a",
        "token": 17,
        "stage": "done",
        "attempts": "1",
        "heartbeat_at": 1.5,
        "lease_expires_at": None,
        "created_at": 1,
        "updated_at": "2.5",
        "stage_durations": {"load": 0.1},
        "result": '"ok"',
        "prompt_tokens": 12,
    }
    job = JobState.from_fields("k", data, READ_AT)
    plain = _plain("k", data, READ_AT)
    assert list(job.__dict__) == [f.name for f in dataclasses.fields(JobState)]
    assert job == plain and hash(job) == hash(plain) and repr(job) == repr(plain)
    assert job.to_dict() == plain.to_dict()
    assert list(job.to_dict()) == list(plain.to_dict())
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.token = 3  # type: ignore[misc]


def test_evolve_is_dataclasses_replace() -> None:
    rec = JobState(key="k", status=Status.RUNNING, owner_id="n#1.a", token=5, created_at=1.0)
    changes = {"status": Status.DONE, "result": '"x"', "token": 6, "read_at": 9.0}
    new = rec.evolve(**changes)
    old = dataclasses.replace(rec, **changes)
    assert new == old and repr(new) == repr(old) and new.to_dict() == old.to_dict()
    assert list(new.__dict__) == list(old.__dict__)
    assert rec.token == 5 and rec.status is Status.RUNNING  # the original is untouched
    assert rec.evolve() == rec and rec.evolve() is not rec
    with pytest.raises(TypeError, match="no_such_field"):
        rec.evolve(no_such_field=1)


@pytest.mark.parametrize("kind", list(KIND_SAME_TYPE))
def test_a_kind_returns_a_value_of_its_same_type_unchanged(kind: str) -> None:
    same = KIND_SAME_TYPE[kind]
    samples = {str: ["a", "RUNNING", " ", "\x00", "é" * 600], int: [0, 1, -5, 1 << 80]}
    for value in samples.get(same, [0.0, -1.5, 1e300, float("inf")]):
        assert KIND_CONVERTERS[kind](value) is value
