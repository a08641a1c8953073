"""The shared job record (the first seed's section 17) and its four health states (section 16).

Every timestamp in a :class:`JobState` is on the **store's** clock, in float seconds since
the epoch; ``read_at`` is the store's clock when the record was read, so remaining lease
time and idle time are differences of two store readings, never of two machines' clocks.
"""

from __future__ import annotations

import enum
import hashlib
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

import orjson

from ai_lease.errors import CorruptRecord, JobSpecError
from ai_lease.failure import ended_by, render
from ai_lease.job_fields import FIELD_KINDS, KIND_CONVERTERS, KIND_SAME_TYPE
from ai_lease.job_provider import ProviderChoice
from ai_lease.job_shapes import check_shapes
from ai_lease.text_safety import UNSAFE

__all__ = ["Health", "Job", "JobState", "RunFacts", "Status", "fingerprint", "validate_key"]

# A key is shown in terminals and pages and stored everywhere: no control (NUL included),
# format (U+202E, U+200B, U+FEFF…) or separator (U+2028, U+0085) character, tab and newline
# included, and no lone surrogate (no store can encode one as UTF-8).
_KEY_BAD = re.compile(f"[\t\n]|{UNSAFE.pattern}")
# Fields added after jobs were first stored: in the payload (and so the fingerprint) only
# when set, so a job that sets none of them keeps the fingerprint it always had.
_WHEN_SET = ("tools", "tool_choice", "response_format", "images", "provider")


MAX_TEMPERATURE = 2.0  # OpenAI's range; other servers accept the same or less
MAX_TOKENS = 1 << 24


def sampling_problem(temperature: object, max_tokens: object) -> str | None:
    """What is wrong with a ``temperature`` / ``max_tokens`` pair (None: both fine or unset).

    A NaN would vanish from the fingerprint (JSON has no NaN) and reach the server as null.
    """
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not 0 <= temperature <= MAX_TEMPERATURE  # False for NaN
    ):
        limit = f"{MAX_TEMPERATURE:g}"
        return f"temperature: must be a number from 0 to {limit} (got {temperature!r:.40})"
    if max_tokens is not None and (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= MAX_TOKENS
    ):
        return f"max_tokens: must be an integer from 1 to {MAX_TOKENS} (got {max_tokens!r:.40})"
    return None


def validate_key(key: str) -> str:
    """Return ``key`` if it can name a job (1-512 characters, none of them a control,
    format or separator character or a lone surrogate), else raise :class:`JobSpecError`."""
    if not isinstance(key, str) or not 1 <= len(key) <= 512 or _KEY_BAD.search(key):
        shown = repr(key) if not isinstance(key, str) or len(key) <= 80 else repr(key[:60]) + "…"
        raise JobSpecError(
            f"job key {shown} is invalid: use 1 to 512 characters with no control, format "
            "(such as U+202E or U+200B) or line-separator characters (NUL included) and no "
            "lone surrogates"
        )
    return key


def fingerprint(payload: Any) -> str:
    """A stable digest of a job's payload: the same key with another payload is a conflict."""
    blob = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(blob).hexdigest()[:32]


@dataclass(frozen=True)
class Job:
    """What to run. ``key`` names the job across nodes (its idempotency key); everything
    else but ``priority`` is its payload: resubmitting the same key with another payload is a
    conflict.

    ``tools``, ``tool_choice`` and ``response_format`` go to the model as OpenAI's chat
    fields; ``images`` (http(s) or data: URLs) become image parts of the user message.
    They are checked and bounded by :mod:`ai_lease.job_shapes`. ``provider`` (a
    :class:`~ai_lease.job_provider.ProviderChoice`, or a mapping of its fields) names the
    provider that must answer it, wherever it runs (never a key). ``priority`` (-100..100,
    default 0) is its place among the calls waiting for a provider slot under ``[limits]``
    (higher first, then first come): how urgent, not what to compute, so it travels in the
    stored spec but a resubmission need not match it.

    >>> Job("report-42", input="Long text to summarise…", prompt="summarize").key
    'report-42'
    """

    key: str
    input: Any = None
    input_file: str | None = None
    prompt: str = "summarize"
    prompt_text: str | None = None
    variables: Mapping[str, Any] = field(default_factory=dict)
    system: str | None = None
    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    output: str = "text"
    stream: bool = True
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    response_format: Mapping[str, Any] | None = None
    images: Sequence[str] | None = None
    provider: ProviderChoice | None = None
    allow_empty: bool = False  # an answer with no text (and no tool call) may be stored
    priority: int = 0  # its turn for a provider slot: higher first (not in the payload)

    def __post_init__(self) -> None:
        validate_key(self.key)
        try:  # a mapping (a job file's table, a stored spec's object) becomes the value
            object.__setattr__(self, "provider", ProviderChoice.of(self.provider))
        except JobSpecError as exc:
            raise JobSpecError(f"job {self.key!r}: {exc}") from None
        if problem := sampling_problem(self.temperature, self.max_tokens):
            raise JobSpecError(f"job {self.key!r}: {problem}")
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not -100 <= self.priority <= 100
        ):
            raise JobSpecError(
                f"job {self.key!r}: priority must be an integer in -100..100, "
                f"got {self.priority!r:.40}"
            )
        if self.output not in ("text", "json"):
            raise JobSpecError(
                f"job {self.key!r}: output must be 'text' or 'json', got {self.output!r}"
            )
        check_shapes(
            self.key,
            tools=self.tools,
            tool_choice=self.tool_choice,
            response_format=self.response_format,
            images=self.images,
        )

    def payload(self) -> dict[str, Any]:
        """Everything but the key: what the fingerprint covers (tools, tool choice,
        response format, images, the provider choice and ``allow_empty`` only when set)."""
        out = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if name not in ("key", "priority")
        }
        out["variables"] = dict(self.variables)
        if self.provider is not None:
            out["provider"] = self.provider.options()
        for name in _WHEN_SET:
            if out[name] is None:
                del out[name]
        if not self.allow_empty:
            del out["allow_empty"]  # in the payload only when set: old fingerprints hold
        return out

    def fingerprint(self) -> str:
        return fingerprint(self.payload())

    def to_spec(self) -> str:
        """The job as JSON (key included, and a priority other than 0), as stored for workers."""
        urgency = {"priority": self.priority} if self.priority else {}
        return orjson.dumps({"key": self.key, **self.payload(), **urgency}).decode()

    @classmethod
    def from_spec(cls, spec: str) -> Job:
        """The job a stored spec describes."""
        try:
            data = orjson.loads(spec)
            if isinstance(data, dict) and data.get("input_file") is not None:
                # A worker never opens a path taken from the store: whoever submits reads
                # the file and stores its text (see ai_lease.inputs).
                raise JobSpecError(
                    "stored job spec names an input_file: a worker never opens a path "
                    "taken from the store; submit the job again so its text is stored"
                )
            return cls(**data)
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise JobSpecError(f"stored job spec is not valid: {exc}") from None


class Status(enum.StrEnum):
    PENDING = "PENDING"  # recorded, nobody holds it (new, released, or waiting to be retried)
    RUNNING = "RUNNING"  # an owner holds (or held, if its lease lapsed) the lease
    DONE = "DONE"  # one result committed; terminal
    FAILED = "FAILED"  # gave up with a reason; terminal
    CANCELLED = "CANCELLED"  # cancelled by key (``ai-lease cancel``): never runs again; terminal

    @property
    def terminal(self) -> bool:
        return self in (Status.DONE, Status.FAILED, Status.CANCELLED)


class Health(enum.StrEnum):
    """The seed's four owner states: heartbeat fresh or not x progress fresh or not."""

    HEALTHY = "healthy"  # heartbeat ok, progress ok: keep renewing
    NODE_LOST = "node lost"  # heartbeat stale, progress still fresh (or unknown): wait
    ZOMBIE = "zombie"  # heartbeat ok, progress timed out: stop renewing
    DEAD = "dead"  # heartbeat stale and progress timed out: take over


@dataclass(frozen=True)
class RunFacts:
    """What one attempt ran, as its commit or fail records it: the model call's provider,
    model and token usage, its first-token time, and each stage's duration (seconds)."""

    provider: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None  # part of completion_tokens, told apart
    first_token_s: float | None = None
    first_visible_s: float | None = None  # to the first answer text (after any reasoning)
    stage_durations: Mapping[str, float] = field(default_factory=dict)

    def durations_json(self) -> str | None:
        """``stage_durations`` as the record stores it (None when empty)."""
        if not self.stage_durations:
            return None
        return orjson.dumps({k: round(v, 6) for k, v in self.stage_durations.items()}).decode()


@dataclass(frozen=True)
class JobState:
    """One job's record as the store holds it."""

    key: str
    status: Status
    owner_id: str | None = None
    token: int = 0
    stage: str | None = None
    progress_version: int = 0
    heartbeat_at: float | None = None
    last_progress_at: float | None = None
    lease_expires_at: float | None = None
    max_no_progress: float | None = None
    stall_policy: str = "expire"
    renew_interval: float | None = None  # the owner's renew interval (acquire, renew)
    attempts: int = 0  # acquisitions that started an attempt (same-node retries too)
    takeovers: int = 0  # acquisitions by another node after a lapse, release or stall
    takeover_cause: str | None = None  # the last takeover's: expired | released | stalled
    stalled_attempt: int = 0  # the last attempt the store saw stall (renew, report_stall)
    missed_renewals: int = 0
    last_error: str | None = None
    last_error_attempt: int | None = None  # which attempt wrote last_error
    last_error_owner: str | None = None  # and which owner (node id#n.random)
    # Why a FAILED job failed, as a code (ai_lease.failure.FailureKind); None otherwise.
    failure_kind: str | None = None
    stall_snapshot: str | None = None
    fingerprint: str | None = None
    spec: str | None = None  # the job's payload as JSON, for workers (set by submit)
    result: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    read_at: float = 0.0
    started_at: float | None = None  # first acquisition (store clock): the job deadline's start
    # Why the model stopped, when the commit said ("length": a whole answer, capped).
    finish_reason: str | None = None
    finished_at: float | None = None  # commit or fail (store clock)
    # What ran (RunFacts), as the last commit or fail recorded it.
    provider: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None  # part of completion_tokens, told apart
    first_token_s: float | None = None
    first_visible_s: float | None = None  # to the first answer text (after any reasoning)
    stage_durations: str | None = None  # a JSON object: stage name -> seconds
    # Where the running attempt's resumable stream stood (JSON, written by renewals, fenced;
    # cleared by commit, fail and retry): a new owner resumes from it instead of re-calling.
    checkpoint: str | None = None

    @property
    def lease_remaining(self) -> float:
        """Seconds the current lease still runs, by the store's clock (0 when lapsed)."""
        if self.status is not Status.RUNNING or self.lease_expires_at is None:
            return 0.0
        return max(0.0, self.lease_expires_at - self.read_at)

    @property
    def lease_live(self) -> bool:
        return self.lease_remaining > 0

    @property
    def since_heartbeat(self) -> float | None:
        return None if self.heartbeat_at is None else self.read_at - self.heartbeat_at

    @property
    def since_progress(self) -> float | None:
        """Seconds since the owner's last published progress; None once the job has ended
        (a finished job's progress age is no news, and would only grow)."""
        if self.last_progress_at is None or self.status.terminal:
            return None
        return self.read_at - self.last_progress_at

    def health(self, grace: float | None = None) -> Health | None:
        """The seed's four-state judgement for a RUNNING job (None otherwise; section 16).

        Heartbeat fresh: ``since_heartbeat <= renew_interval + grace``; progress fresh:
        ``since_progress <= max_no_progress + grace``. ``grace`` defaults to the record's
        renew interval (the store learns of progress only at renewals). A record without
        a renew interval (written before it was kept) judges the heartbeat by its lease.
        """
        if self.status is not Status.RUNNING:
            return None
        slack = (self.renew_interval or 0.0) if grace is None else grace
        beat = self.since_heartbeat
        if self.renew_interval is None or beat is None:
            alive = self.lease_live
        else:
            alive = beat <= self.renew_interval + slack
        idle = self.since_progress
        stuck = (
            idle is not None
            and self.max_no_progress is not None
            and idle > self.max_no_progress + slack
        )
        if alive:
            return Health.ZOMBIE if stuck else Health.HEALTHY
        return Health.DEAD if stuck else Health.NODE_LOST

    @classmethod
    def from_fields(cls, key: str, data: Mapping[str, Any], read_at: float) -> JobState:
        """Build a record from stored fields, checking every type; raise :class:`CorruptRecord`.

        Each field is checked as its kind's function in :mod:`ai_lease.job_fields` checks it
        (same errors, same bounds); an unset field, or a value already of the exact type
        that function would return it as (a non-empty ``str``, an ``int``, a ``float``), is
        taken as it is, without the call."""
        kwargs = _TEMPLATE.copy()  # every field, in field order
        kwargs["key"], kwargs["read_at"] = key, read_at
        get = data.get
        try:
            for name, convert, unset, same in _CONVERTERS:
                value = get(name)
                if value is None:
                    kwargs[name] = unset
                    continue
                if value.__class__ is bytes:
                    value = value.decode()
                if value.__class__ is same and value != "":
                    kwargs[name] = value
                else:
                    kwargs[name] = convert(value)
        except (TypeError, ValueError, UnicodeDecodeError):
            raise CorruptRecord(key, f"field {name!r} holds {str(value)[:40]!r}") from None
        if kwargs["status"] is None:
            raise CorruptRecord(key, "no status field")
        if kwargs["status"] is not Status.FAILED:
            kwargs["failure_kind"] = None
        elif kwargs["failure_kind"] is not None:  # the stored code, rendered for readers
            kwargs["last_error"] = render(
                kwargs["failure_kind"], kwargs["attempts"], kwargs["last_error"]
            )
        return _built(cls, kwargs)

    def evolve(self, **changes: Any) -> JobState:
        """A copy with ``changes`` (what :func:`dataclasses.replace` gives: the values are
        taken as given, an unknown field name is a ``TypeError``), without calling the
        frozen ``__init__`` field by field: the rules build several records per job."""
        if not _FIELD_NAMES.issuperset(changes):
            unknown = sorted(set(changes) - _FIELD_NAMES)
            raise TypeError(f"JobState has no field {unknown[0]!r}")
        values = self.__dict__.copy()
        values.update(changes)
        return _built(self.__class__, values)

    @property
    def ended_by(self) -> str | None:
        """What ended a FAILED job (a :class:`~ai_lease.failure.FailureKind` value): its
        ``failure_kind``, or for one given up on, what ended its last attempt."""
        return ended_by(self.failure_kind, self.attempts, self.last_error)

    @property
    def output(self) -> Any:
        """The committed result, decoded (results are stored as JSON documents)."""
        return None if self.result is None else orjson.loads(self.result)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (status as its name)."""
        out = dict(zip(_STATE_NAMES, _values_of(self.__dict__), strict=True))
        out["status"] = self.status.value
        out["stage_durations"] = self.durations
        return out

    @property
    def durations(self) -> dict[str, float] | None:
        """``stage_durations`` decoded (None when the record has none)."""
        if self.stage_durations is None:
            return None
        value: dict[str, float] = orjson.loads(self.stage_durations)
        return value


_BY_VALUE: dict[str, Status] = {member.value: member for member in Status}


def _status(value: Any) -> Status | None:
    if value.__class__ is str and (member := _BY_VALUE.get(value)) is not None:
        return member
    return None if value is None or value == "" else Status(value)


def _built(cls: type[JobState], values: dict[str, Any]) -> JobState:
    """A record of ``values`` (every field, in field order), as ``cls(**values)`` builds it
    (JobState has no ``__post_init__``) but without its frozen field-by-field setattrs."""
    job = object.__new__(cls)
    job.__dict__.update(values)
    return job


# Computed once: the field names (in order), a getter of their values, and every field's
# default (for the fields ``from_fields`` sets, each is overwritten).
_STATE_NAMES: tuple[str, ...] = tuple(JobState.__dataclass_fields__)
_FIELD_NAMES = frozenset(_STATE_NAMES)
_values_of = operator.itemgetter(*_STATE_NAMES)
_TEMPLATE: dict[str, Any] = {
    name: None if f.default is MISSING else f.default
    for name, f in JobState.__dataclass_fields__.items()
}
# Each stored field with the function that checks and converts it, its value when unset
# (the function's answer for None) and the type it passes through unchanged (hot: two
# records per job).
_CONVERTERS: tuple[tuple[str, Callable[[Any], Any], Any, type | None], ...] = tuple(
    (name, convert, convert(None), KIND_SAME_TYPE.get(kind))
    for name, kind in FIELD_KINDS.items()
    for convert in (_status if kind == "status" else KIND_CONVERTERS[kind],)
)
