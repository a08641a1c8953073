"""What a command that only looks (``ls``, ``status``, ``result``, …) reads of the settings,
read without pydantic when it can be: the store's URL, namespace and operation timings, and
the lease's renew interval and φ threshold (for a job's health).

:func:`quick_look` reads the same sources as :func:`~ai_lease.settings.load_settings`
(``AI_LEASE_*`` over the TOML file over defaults, the file found the same way) with the same
code, then answers only when every value given is one of those fields and plainly valid: a
number or a numeric string inside its bounds, a non-empty string, a known store scheme, the
lease timings' own rules met. Anything else (another section, a value it is not sure of)
gives None, and the caller loads the whole :class:`~ai_lease.settings.Settings`, which gives
the answer or the error. So a look gets the same values and the same errors either way; only
a settings file or variable outside these fields costs it pydantic-settings
(tests/test_settings_look.py compares the two paths).

>>> quick_look(None, env={"AI_LEASE_LEASE__RENEW_INTERVAL": "4"}).renew_interval  # no file
4.0
>>> quick_look(None, env={"AI_LEASE_STREAM__IDLE": "4"}) is None  # load_settings() says
True
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ai_lease import settings_sources as sources
from ai_lease.errors import ConfigError
from ai_lease.settings_errors import Loc
from ai_lease.stores.urls import SCHEMES
from ai_lease.timeouts import LeaseTimings, StreamTimeouts

if TYPE_CHECKING:
    from ai_lease.settings import Settings

__all__ = ["LookSettings", "quick_look"]

DAY_S = 86_400.0  # the settings' bound on a duration (Seconds in ai_lease.settings)


@dataclass(frozen=True)
class LookSettings:
    """Where the store is, how long one operation on it may take, and what a job's health
    is judged with; the defaults are :class:`~ai_lease.settings.Settings`' own."""

    url: str = "sqlite:///.ai-lease/ai-lease.db"
    namespace: str = "ai_lease"
    op_timeout: float = 2.0
    poll_interval: float = 1.0
    ttl: float = 30.0
    renew_interval: float = 5.0
    phi_threshold: float = 8.0

    @classmethod
    def of(cls, settings: Settings) -> LookSettings:
        """The same fields of the whole settings."""
        store, lease = settings.store, settings.lease
        return cls(
            store.url,
            store.namespace,
            store.op_timeout,
            store.poll_interval,
            lease.ttl,
            lease.renew_interval,
            lease.phi_threshold,
        )


# The number a string must spell to be taken here: plain decimal digits (pydantic reads
# more forms, "1e3", " 5 ", "5_0": those go to it).
_NUMBER = re.compile(r"(?:0|[1-9][0-9]{0,8})(?:\.[0-9]{1,9})?")


def _seconds(value: Any) -> float | None:
    """A duration within (0, 1 day], finite, as pydantic would read it; else None."""
    number = _number(value)
    return number if number is not None and 0 < number <= DAY_S else None


def _phi(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and 6 <= number <= 10 else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and _NUMBER.fullmatch(value):
        number = float(value)
    else:
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    """A non-empty string (encodable: no lone surrogate); else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _store_url(value: Any) -> str | None:
    url = _text(value)
    if url is None or "://" not in url:
        return None
    return url if url.partition("://")[0].lower() in SCHEMES else None


_READERS: dict[Loc, tuple[str, Callable[[Any], Any]]] = {
    ("store", "url"): ("url", _store_url),
    ("store", "namespace"): ("namespace", _text),
    ("store", "op_timeout"): ("op_timeout", _seconds),
    ("store", "poll_interval"): ("poll_interval", _seconds),
    ("lease", "ttl"): ("ttl", _seconds),
    ("lease", "renew_interval"): ("renew_interval", _seconds),
    ("lease", "phi_threshold"): ("phi_threshold", _phi),
}


def quick_look(
    config_path: str | Path | None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> LookSettings | None:
    """The look's settings from the same sources as ``load_settings(config_path, env,
    **overrides)``, or None when only the whole settings can say (then load those).

    A problem with the file itself (missing, unreadable, not TOML) raises the same
    :class:`ConfigError` ``load_settings`` raises: it reads the file the same way, first."""
    ours = sources.our_variables(os.environ if env is None else env)
    from_env = ours.pop(sources.CONFIG_ENV_VAR, None)
    entries: list[sources.Entry] = []
    path = sources.config_file(config_path, from_env)
    if path is not None:
        entries += sources.leaves(sources.read_toml(path), (), str(path))
    for name, value in sorted(ours.items()):
        loc: Loc = tuple(name[len(sources.ENV_PREFIX) :].lower().split(sources.ENV_DELIMITER))
        entries.append((loc, value, f"environment {name}"))
    entries += sources.leaves(overrides, (), "argument")
    values: dict[str, Any] = {}
    for loc, value, _ in entries:  # lowest precedence first: a later value wins
        reader = _READERS.get(loc)
        if reader is None:
            return None
        name, read = reader
        values[name] = read(value)
    if any(value is None for value in values.values()):
        return None
    look = LookSettings(**values)
    return look if _timings_hold(look) else None


def _timings_hold(look: LookSettings) -> bool:
    """Whether the settings' cross-field rules hold (the rest at their defaults)."""
    try:
        LeaseTimings(look.ttl, look.renew_interval, look.op_timeout, look.poll_interval)
        StreamTimeouts(phi_threshold=look.phi_threshold)
    except ConfigError:
        return False
    return True
