"""Structured log lines from events: key, token, stage and idle time on every line, no secrets.

:class:`JobLogger` is an event sink that writes one line per event to a ``logging`` logger,
as compact text or (``json=True``) one JSON object per line:

>>> configure_logging(json=True)                                    # doctest: +SKIP
>>> hooks = RunHooks(on_event=fan_out(JobLogger(json=True), metrics))
>>> runner = Runner(store, hooks=hooks)                            # doctest: +SKIP

    {"ts":"2026-11-05T09:14:02.117Z","level":"WARNING","event":"stalled","key":"report-42",
     "token":7,"owner":"node-a:311#1.9f2c","stage":"call_ai","idle_s":90.41,"value":null,
     "detail":"expire: stage 'call_ai' made no progress for 90.41s (budget 90s)"}

Details pass through :func:`redact` first: API keys, bearer tokens and passwords in URLs
never reach a log line. Lease renewals log at DEBUG, trouble (stalls, refusals, fencing,
timeouts, failures) at WARNING, everything else at INFO; a follower's repeated polls log
once per owner and stage.

In JSON mode every lease operation's outcome is at INFO or above, so a log reader can
rebuild who held which lease when: renewals are sampled by count, never dropped silently.
Each lease's first renewal and every :data:`RENEWAL_SAMPLE` th get a line, and so does its
last one before the lease ends (commit, release, failure, loss); a renewal line carries
``attrs.renewals`` (this lease's renewals so far) and ``attrs.unlogged`` (renewals since
the previous renewal line that got no line of their own).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

import orjson

from ai_lease.lease.events import Event, EventSink
from ai_lease.redaction import redact

__all__ = [
    "RENEWAL_SAMPLE",
    "JobLogger",
    "configure_logging",
    "event_fields",
    "fan_out",
    "json_configured",
    "redact",
    "remove_handlers",
]

LOGGER_NAME = "ai_lease.events"
RENEWAL_SAMPLE = 10  # JSON mode: every 10th renewal of a lease gets a line (see above)

WARNING_KINDS = frozenset(
    {
        "renew_refused",
        "renew_failed",
        "stalled",
        "self_fenced",
        "fenced",
        "stream_timeout",
        "failed",
        "job_failed",
        "job_error",
        "job_quarantined",
        "store_unavailable",
        "loop_blocked",
    }
)
DEBUG_KINDS = frozenset({"renewed"})
_FORGET_KINDS = frozenset({"acquired", "done", "failed", "committed"})
_MAX_FOLLOWED = 4096
# Events that end (or may end) a lease: its held-back last renewal is logged before them.
_LEASE_END_KINDS = frozenset(
    {
        "committed",
        "released",
        "failed",
        "fenced",
        "retry",
        "self_fenced",
        "renew_refused",
        "store_unavailable",
    }
)


class _Renewals:
    """One lease's renewals as the JSON log has seen them."""

    __slots__ = ("count", "held", "skipped")

    def __init__(self) -> None:
        self.count = 0  # renewals of this lease so far
        self.held: Event | None = None  # the latest renewal without a line of its own yet
        self.skipped = 0  # renewals before ``held`` since the last renewal line


def event_fields(event: Event) -> dict[str, Any]:
    """The fields of one log line (the same in text and JSON), secrets redacted."""
    fields: dict[str, Any] = {
        "event": event.kind,
        "key": event.key or None,
        "token": event.token,
        "owner": event.owner_id,
        "stage": event.stage,
        "idle_s": None if event.idle_s is None else round(event.idle_s, 2),
        "value": None if event.value is None else round(event.value, 4),
        "detail": redact(event.detail),
    }
    if event.attrs:  # e.g. a model call's token counts
        fields["attrs"] = {
            name: redact(value) if isinstance(value, str) else value
            for name, value in event.attrs.items()
        }
    return fields


def _level(kind: str) -> int:
    if kind in WARNING_KINDS:
        return logging.WARNING
    return logging.DEBUG if kind in DEBUG_KINDS else logging.INFO


def _timestamp(at: float) -> str:
    when = dt.datetime.fromtimestamp(at, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _text_value(value: object) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in "=\"'" for c in text):
        return orjson.dumps(text).decode()
    return text


def text_line(fields: dict[str, Any]) -> str:
    """``stalled key=report-42 token=7 owner=… stage=call_ai idle=90.41s value=… detail``."""
    parts = [fields["event"]]
    for name in ("key", "token", "owner", "stage"):
        if fields[name] is not None:
            parts.append(f"{name}={_text_value(fields[name])}")
    if fields["idle_s"] is not None:
        parts.append(f"idle={fields['idle_s']:.2f}s")
    if fields["value"] is not None:
        parts.append(f"value={fields['value']:g}")
    for name, value in (fields.get("attrs") or {}).items():
        parts.append(f"{name}={_text_value(value)}")
    if fields["detail"]:
        parts.append(fields["detail"])
    return " ".join(parts)


def json_line(fields: dict[str, Any], level: int, at: float) -> str:
    """One JSON object: ``ts``, ``level``, then the event's fields."""
    head = {"ts": _timestamp(at), "level": logging.getLevelName(level)}
    return orjson.dumps(head | fields).decode()


class JobLogger:
    """An event sink writing one line per event to ``logger`` (default ``ai_lease.lease.events``).

    >>> log = JobLogger(json=True)
    >>> runner = Runner(store, hooks=RunHooks(on_event=log))          # doctest: +SKIP

    The event's fields also ride on each record as ``record.ai_lease`` (a dict), and its
    time (``Event.at``, when the operation happened, which for a held-back renewal is
    earlier than the record's ``created``) as ``record.ai_lease_at``, for your own formatter.
    """

    def __init__(self, logger: logging.Logger | None = None, *, json: bool = False) -> None:
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self.json = json
        self._following: dict[str, tuple[object, ...]] = {}
        self._renewals: dict[tuple[str, int | None], _Renewals] = {}

    def __call__(self, event: Event) -> None:
        if self.json:
            if event.kind == "renewed":
                self._sample_renewal(event)
                return
            if event.kind in _LEASE_END_KINDS:
                self._flush_renewals(event)
        level = _level(event.kind)
        if not self.logger.isEnabledFor(level) or self._repeated(event):
            return
        self._write(event, level)

    def _write(self, event: Event, level: int, extra: dict[str, int] | None = None) -> None:
        fields = event_fields(event)
        if extra:
            fields["attrs"] = {**fields.get("attrs", {}), **extra}
        line = json_line(fields, level, event.at) if self.json else text_line(fields)
        # the event's own time: a held-back renewal is logged when its lease ends, but its
        # line must say when the renewal happened (the record's ``created`` is the flush)
        self.logger.log(level, line, extra={"ai_lease": fields, "ai_lease_at": event.at})

    def _sample_renewal(self, event: Event) -> None:
        """JSON mode: a line for the 1st and every RENEWAL_SAMPLE-th renewal of a lease;
        the others are counted, and the latest is held back for the lease's end."""
        lease = (event.key, event.token)
        seen = self._renewals.get(lease)
        if seen is None:
            if len(self._renewals) >= _MAX_FOLLOWED:
                self._renewals.clear()
            seen = self._renewals[lease] = _Renewals()
        seen.count += 1
        if seen.count == 1 or seen.count % RENEWAL_SAMPLE == 0:
            unlogged = seen.skipped + (seen.held is not None)
            seen.held, seen.skipped = None, 0
            self._write(event, logging.INFO, {"renewals": seen.count, "unlogged": unlogged})
            return
        seen.skipped += seen.held is not None
        seen.held = event

    def _flush_renewals(self, event: Event) -> None:
        """Before a lease's end: the line of its last renewal, if it had none yet."""
        seen = self._renewals.pop((event.key, event.token), None)
        if seen is not None and seen.held is not None:
            extra = {"renewals": seen.count, "unlogged": seen.skipped}
            self._write(seen.held, logging.INFO, extra)

    def _repeated(self, event: Event) -> bool:
        """A follower's poll that says nothing new (same owner, token and stage)."""
        if event.kind in _FORGET_KINDS:
            self._following.pop(event.key, None)
        if event.kind != "following":
            return False
        seen = (event.owner_id, event.token, event.stage)
        if self._following.get(event.key) == seen:
            return True
        if len(self._following) >= _MAX_FOLLOWED:
            self._following.clear()
        self._following[event.key] = seen
        return False


class _JsonFormatter(logging.Formatter):
    """A JSON line for every record: an event's fields, or the message (and traceback) of
    any other log, newlines escaped, so a multi-line library message stays one line."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "ai_lease", None)
        at = getattr(record, "ai_lease_at", record.created)  # an event's: when it happened
        if not isinstance(fields, dict):
            fields = {"event": "log", "logger": record.name, "detail": redact(record.getMessage())}
            if record.exc_info:
                fields["exc"] = redact(self.formatException(record.exc_info))
        return json_line(fields, record.levelno, at)


def configure_logging(
    *, json: bool = False, level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Logger:
    """Send ``ai_lease`` logs to ``stream`` (default stderr), one line each; returns the
    events logger. Calling it again replaces the handler it installed before.

    With ``json`` the handler also sits on the root logger and takes :mod:`warnings`, so
    every other library's record (psycopg-pool's reconnect messages, asyncio's, httpx's)
    is a JSON line too, at the root logger's level (WARNING unless you set it).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonFormatter() if json else logging.Formatter("%(message)s"))
    handler._ai_lease = True  # type: ignore[attr-defined]
    remove_handlers()
    root = logging.getLogger("ai_lease")
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    if json:
        logging.getLogger().addHandler(handler)
        logging.captureWarnings(True)
    return logging.getLogger(LOGGER_NAME)


def json_configured() -> bool:
    """:func:`configure_logging` installed JSON lines (process isolation's children follow)."""
    return any(
        getattr(h, "_ai_lease", False) and isinstance(h.formatter, _JsonFormatter)
        for h in logging.getLogger().handlers
    )


def remove_handlers() -> None:
    """Take back what :func:`configure_logging` installed (its handlers, the warnings)."""
    had_json = json_configured()
    for logger in (logging.getLogger("ai_lease"), logging.getLogger()):
        for handler in [h for h in logger.handlers if getattr(h, "_ai_lease", False)]:
            logger.removeHandler(handler)
    if had_json:  # only what JSON mode turned on: a caller's own capture stays
        logging.captureWarnings(False)


def fan_out(*sinks: EventSink | None) -> EventSink:
    """One sink that passes each event to every given sink (None entries are skipped).

    >>> on_event = fan_out(Metrics(), JobLogger(), view.on_event)    # doctest: +SKIP

    A failing sink is logged and skipped: observability never breaks a job.
    """
    active: list[Callable[[Event], None]] = [s for s in sinks if s is not None]

    def emit(event: Event) -> None:
        for sink in active:
            try:
                sink(event)
            except Exception:
                logging.getLogger(LOGGER_NAME).exception("event sink %r failed", sink)

    return emit
