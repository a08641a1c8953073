"""Text from outside, made storable in every store by one rule.

PostgreSQL's ``text`` holds no NUL (U+0000), and no store can encode a lone surrogate
(U+D800..U+DFFF, which Python strings may carry) as UTF-8. Text from outside the process
— a provider's error message, its finish reason, a stage name, a note's request id, a key
from a URL — reaches the stores through three doors, each with its rule:

* **diagnostics** (error messages and reasons, finish reasons, stall snapshots, stage,
  provider and model names, notes): :func:`diagnostic` writes each NUL as the six visible
  characters ``\\u0000`` and each lone surrogate as ``\\udXXX`` (JSON's spelling of them),
  on every store alike, so a record reads the same wherever it is kept and says, in the
  text itself, what was there. Clipped to :data:`SNAPSHOT_LIMIT`.
* **what is kept exactly** (a result, a spec, a checkpoint): :func:`exact` never alters it.
  Text a store cannot hold as it is is refused with an :class:`~ai_lease.errors.InputError`
  naming what and where, nothing written: a lone surrogate on every store, a NUL on
  PostgreSQL. (The runner stores a result as JSON text, where a NUL is the escape
  ``\\u0000``, so a run never meets this; a caller of ``commit`` with raw text may.)
* **names** (job keys, owner ids, key prefixes): refused, never altered — an altered name
  would be another job's, or fail the fence. Keys are checked by
  :func:`ai_lease.job.validate_key`, owner ids by :func:`check_owner`, worker ids by
  :func:`ai_lease.lease.queue.storable_worker` (which escapes the host name); a prefix that
  no key can start (:func:`key_can_start`) simply matches nothing.

>>> diagnostic("bad \\x00 request")
'bad \\\\u0000 request'
"""

from __future__ import annotations

import re
from dataclasses import replace

from ai_lease.errors import InputError, JobSpecError
from ai_lease.job import RunFacts, validate_key

__all__ = [
    "SNAPSHOT_LIMIT",
    "check_owner",
    "diagnostic",
    "exact",
    "key_can_start",
    "ran",
    "storable",
]

SNAPSHOT_LIMIT = 16_000
"""Stall snapshots and error texts are cut to this many characters."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def storable(text: str) -> bool:
    """Whether every store can hold ``text`` as it is (no NUL, no lone surrogate)."""
    if text.isascii():  # a flag read: the usual path scans nothing else
        return "\x00" not in text
    return _UNSTORABLE.search(text) is None


def _escaped(text: str) -> str:
    return _UNSTORABLE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def diagnostic(text: str | None, limit: int = SNAPSHOT_LIMIT) -> str | None:
    """``text`` clipped to ``limit`` characters, each NUL and lone surrogate written as its
    visible escape (``\\u0000``, ``\\ud800``): storable in every store. None stays None."""
    if text is None:
        return None
    text = text[:limit]
    return text if storable(text) else _escaped(text)[:limit]


def ran(facts: RunFacts | None) -> RunFacts | None:
    """``facts`` with its provider and model names made storable (:func:`diagnostic`)."""
    if facts is None or all(storable(name or "") for name in (facts.provider, facts.model)):
        return facts
    return replace(facts, provider=diagnostic(facts.provider), model=diagnostic(facts.model))


def exact(op: str, key: str, what: str, text: str, *, nul: bool = True) -> str:
    """``text`` unchanged when the store can keep it exactly (``nul``: whether it holds a
    NUL), else an :class:`InputError` saying where the first character it cannot is."""
    if storable(text):
        return text
    found = (_SURROGATE if nul else _UNSTORABLE).search(text)
    if found is None:  # NULs only, and this store holds them
        return text
    char = ord(found.group())
    which = (
        "a NUL (U+0000), which PostgreSQL text"
        if char == 0
        else f"a lone surrogate (U+{char:04X}), which UTF-8 (so no store)"
    )
    raise InputError(
        f"{op}: the {what} of job {key!r:.80} holds {which} cannot hold, at offset "
        f"{found.start()}: nothing was written (a store never alters a {what}); escape it "
        f"first, as json.dumps does (it writes \\u{char:04x})"
    )


def check_owner(owner_id: str) -> str:
    """``owner_id`` if a store can keep it exactly, else :class:`InputError`: an owner id is
    part of the fence, so it is never altered."""
    if isinstance(owner_id, str) and owner_id and storable(owner_id):
        return owner_id
    raise InputError(
        f"owner id {owner_id!r:.80} is not storable (empty, or holding a NUL or a lone "
        "surrogate): name the node with printable characters (RunConfig.node_id)"
    )


def key_can_start(prefix: str) -> bool:
    """Whether any job key can start with ``prefix``: exactly when it is a key itself (every
    start of a key is one), so one with a control character, a lone surrogate or over 512
    characters matches nothing."""
    try:
        validate_key(prefix)
    except JobSpecError:
        return False
    return True
