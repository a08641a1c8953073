"""Why a job ended FAILED, as a code: the stores keep a :class:`FailureKind` beside the
message, and the English lives here only (:data:`MESSAGES`, :func:`render`).

The one sentence a store used to write itself, "gave up after N attempts: <last error>"
(a job out of attempts on its next acquire), is now the code ``gave_up`` in the record with
the last attempt's error kept as it was; :func:`render` makes the sentence when the record
is read, and :func:`timeline_detail` does the same for the timeline's ``failed`` entry.

>>> render(FailureKind.GAVE_UP, 2, "B crashed")
'gave up after 2 attempts: B crashed'
>>> kind_of(TimeoutError())
<FailureKind.ERROR: 'error'>
"""

from __future__ import annotations

import enum

from ai_lease.errors import AiLeaseError, InputError, ProviderError, StageTimeout

__all__ = [
    "MESSAGES",
    "FailureKind",
    "cause_kind",
    "ended_by",
    "kept_kind",
    "kind_of",
    "render",
    "stored_error",
    "timeline_detail",
]


class FailureKind(enum.StrEnum):
    """What ended a job FAILED (the record's ``failure_kind``)."""

    TIMED_OUT = "timed_out"  # a time budget ran out: stream, stage or job deadline
    PROVIDER_REFUSED = "provider_refused"  # the provider said no for good (a 400, a 401)
    BAD_INPUT = "bad_input"  # the job itself is wrong (a template variable, a malformed spec)
    GAVE_UP = "gave_up"  # out of attempts: the last attempt's error is the record's
    QUEUE_DEADLINE = "queue_deadline"  # it waited in the queue past its deadline
    ERROR = "error"  # anything else: a stage raised


MESSAGES: dict[FailureKind, str] = {
    FailureKind.TIMED_OUT: "timed out",
    FailureKind.PROVIDER_REFUSED: "the provider refused the request",
    FailureKind.BAD_INPUT: "bad input",
    FailureKind.GAVE_UP: "gave up after {attempts} attempts",
    FailureKind.QUEUE_DEADLINE: "waited in the queue past its deadline",
    FailureKind.ERROR: "failed",
}
"""The one English table of failures (``{attempts}`` is filled in by :func:`render`)."""

_LAPSED = "lease lapsed"  # a job given up on with no error recorded: its leases lapsed
_GAVE_UP_CODE = "gave_up:"  # the timeline detail a store writes: ``gave_up:<attempts>``


def _gave_up(attempts: int) -> str:
    return MESSAGES[FailureKind.GAVE_UP].format(attempts=attempts)


def render(kind: str | None, attempts: int, error: str | None) -> str | None:
    """The failure text readers see for a record holding ``kind`` and ``error`` (the stored
    last error): a given-up job's sentence, any other kind's ``error`` as it is."""
    if kind != FailureKind.GAVE_UP:
        return error
    return f"{_gave_up(attempts)}: {error or _LAPSED}"


def stored_error(kind: str | None, attempts: int, text: str | None) -> str | None:
    """The inverse of :func:`render`: the last error a store keeps for the text a reader
    sees (a store written in Python holds the record it was given)."""
    prefix = f"{_gave_up(attempts)}: "
    if kind != FailureKind.GAVE_UP or text is None or not text.startswith(prefix):
        return text
    return text[len(prefix) :]


def timeline_detail(kind: str, detail: str) -> str:
    """A timeline entry's detail as readers see it: ``gave_up:<attempts>`` rendered."""
    if kind != "failed" or not detail.startswith(_GAVE_UP_CODE):
        return detail
    count = detail[len(_GAVE_UP_CODE) :]
    return _gave_up(int(count)) if count.isdigit() else detail


def kind_of(exc: BaseException) -> FailureKind:
    """The kind of failure ``exc`` is when it ends a job."""
    return _kind_of_class(type(exc))


def _kind_of_class(cls: type) -> FailureKind:
    if issubclass(cls, StageTimeout):
        return FailureKind.TIMED_OUT
    if issubclass(cls, InputError):
        return FailureKind.BAD_INPUT
    if issubclass(cls, ProviderError):
        return FailureKind.PROVIDER_REFUSED
    return FailureKind.ERROR


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    direct: type
    for direct in cls.__subclasses__():
        found += [direct, *_subclasses(direct)]
    return found


def cause_kind(error: str | None) -> FailureKind:
    """The kind of an attempt's stored error, named by its class as ``describe`` writes it
    (``Type: message``): what a given-up job's last attempt ended with."""
    name = (error or "").partition(": ")[0]
    for cls in _subclasses(AiLeaseError):
        if cls.__name__ == name:
            return _kind_of_class(cls)
    return FailureKind.ERROR


def ended_by(kind: str | None, attempts: int, text: str | None) -> str | None:
    """What ended a FAILED record holding ``kind`` (None: not failed, or a record from
    before kinds were kept): its kind, or for a job given up on, what ended its last
    attempt (``text`` is the failure text readers see)."""
    if kind != FailureKind.GAVE_UP:
        return kind
    return cause_kind(stored_error(kind, attempts, text)).value


def kept_kind(kind: str | None, reason: str | None) -> str:
    """The kind a store keeps for ``fail(reason, kind=kind)``: ``kind``, or when none is
    given, the one ``reason`` names by its exception class (``Type: message``, as
    ``describe`` writes it), else ``error``."""
    return kind or cause_kind(reason).value
