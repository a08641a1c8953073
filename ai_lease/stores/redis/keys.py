"""Where one job lives in Redis, and how its hash reads back as a :class:`JobState`.

Keys are ``<namespace>:{<tag>}:job`` (a hash), ``<namespace>:{<tag>}:events`` (a pub/sub
channel) and ``<namespace>:{<tag>}:timeline`` (a list: the job's last events), ``<tag>``
being :func:`hash_tag` of the job key: one Cluster slot per job. Times are stored as
microseconds of the server's clock and read back as seconds.
"""

from __future__ import annotations

import re
from typing import Any

from ai_lease.errors import CorruptRecord
from ai_lease.job import JobState
from ai_lease.lease.timeline import TimelineEntry

__all__ = [
    "decode",
    "decode_fields",
    "decode_read",
    "hash_tag",
    "job_keys",
    "slot_keys",
    "timeline_entry",
    "untag",
    "us",
]

_TIME_FIELDS = frozenset(
    {
        "heartbeat_at",
        "last_progress_at",
        "lease_expires_at",
        "max_no_progress",
        "created_at",
        "updated_at",
        "started_at",
        "renew_interval",
        "finished_at",
        "first_token_s",
        "first_visible_s",
    }
)


def hash_tag(key: str) -> str:
    """The Cluster hash tag of a job key: the key with ``%``, ``{`` and ``}`` escaped, so
    that no key (not even one starting with ``}``) gives an empty or a cut tag.

    >>> hash_tag("}abc{")
    '%7Dabc%7B'
    """
    return key.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def untag(tag: str) -> str:
    """The job key of a hash tag (the inverse of :func:`hash_tag`)."""
    return re.sub("%(25|7B|7D)", lambda m: chr(int(m[1], 16)), tag)


def job_keys(namespace: str, key: str) -> list[str]:
    """The Redis keys of one job: its hash, its event channel and its timeline (a list),
    under one hash tag."""
    tag = hash_tag(key)
    return [f"{namespace}:{{{tag}}}:{part}" for part in ("job", "events", "timeline")]


def slot_keys(namespace: str, limit: str) -> list[str]:
    """The Redis keys of one provider limit, under one hash tag: its holders (a sorted set
    of lease expiries), their tokens (a hash), the waiters' expiries and their order (sorted
    sets), its counter, its wake-up channel, its pause (a key that lives as long as the
    pause does), and the weighted holders' units (a hash)."""
    tag = f"{{{namespace}:slot:{hash_tag(limit)}}}"
    parts = ("holders", "tokens", "waiting", "order", "counter", "wake", "paused", "weights")
    return [f"{tag}:{part}" for part in parts]


def timeline_entry(raw: str) -> TimelineEntry:
    """One timeline entry as the scripts write it: seq, time (us), kind, owner, token, stage
    and detail, tab-separated."""
    seq, at, kind, owner, token, stage, detail = raw.split("\t", 6)
    return TimelineEntry(int(seq), int(at) / 1_000_000, kind, owner, int(token or 0), stage, detail)


def us(seconds: float) -> str:
    """A duration as the scripts take it: whole microseconds."""
    return str(round(seconds * 1_000_000))


def decode(
    key: str,
    flat: list[Any],
    now_us: Any,
    extra: dict[str, Any] | None = None,
    names: tuple[str, ...] | None = None,
) -> JobState:
    """A job hash read at ``now_us``: a flat field, value list, or the values of ``names``
    in order (nil: no such field); ``extra`` fills in values the reply left out (or empty)
    that the caller knows."""
    if names is None:
        data: dict[str, Any] = dict(zip(flat[::2], flat[1::2], strict=True))
    else:
        data = dict(zip(names, flat, strict=True))
    if extra:
        for name, value in extra.items():
            if not data.get(name):
                data[name] = value
    return decode_fields(key, data, now_us)


def decode_read(
    key: str, names: tuple[str, ...], values: list[Any], written: list[Any], now_us: Any
) -> JobState:
    """A record a script read (the values of ``names``, nil: no such field) and then wrote
    over (``written``, a flat field, value list), as it now stands."""
    data = dict(zip(names, values, strict=True))
    data.update(zip(written[::2], written[1::2], strict=True))
    return decode_fields(key, data, now_us)


def decode_fields(key: str, data: dict[str, Any], now_us: Any) -> JobState:
    """A job hash's fields (a dict, changed in place) read at ``now_us``."""
    try:
        for name in _TIME_FIELDS & data.keys():
            if data[name]:  # '' or None (nil): no time
                data[name] = int(data[name]) / 1_000_000
        read_at = int(now_us) / 1_000_000
    except ValueError:
        raise CorruptRecord(key, f"a time field holds {data.get(name)!r:.40}") from None
    return JobState.from_fields(key, data, read_at)
