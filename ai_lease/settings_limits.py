"""The ``[limits]`` section of the settings: provider slots shared by the whole fleet.

>>> limits = LimitsSettings.model_validate({"openai:gpt-4o-mini": {"concurrency": 4}})
>>> limits.call_limits().limits[0]  # doctest: +NORMALIZE_WHITESPACE
CallLimit(name='openai:gpt-4o-mini', concurrency=4, max_wait=60.0, rpm=None, adaptive=False,
          min_concurrency=1, tpm=None)

One table per limit, named by what it limits (see :mod:`ai_lease.lease.call_limits`)::

    [limits]
    max_wait = 60                        # seconds a call waits for a slot (every limit's default)

    [limits."openai-compatible:qwen2.5"] # a provider's model
    concurrency = 4

    [limits."http://10.0.0.5:8080/v1"]   # one server, whatever model a job names
    concurrency = 1
    max_wait = 300

    [limits."openai:gpt-4o-mini"]        # calls started and tokens spent in any minute
    rpm = 500
    tpm = 200000

    [limits."anthropic"]                 # fewer at once while the provider is overloaded
    concurrency = 16
    adaptive = true
    min_concurrency = 2

The tables are read from the TOML file only (a limit's name is not an environment variable's);
``AI_LEASE_LIMITS__MAX_WAIT`` sets the default wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from ai_lease.errors import InputError
from ai_lease.lease.call_limits import (
    DEFAULT_MAX_WAIT,
    MAX_WAIT_RANGE,
    CallLimit,
    CallLimits,
    url_limit,
)
from ai_lease.lease.slots import MAX_CAPACITY, MAX_UNITS, check_limit
from ai_lease.settings_provider import _Section

__all__ = ["MAX_LIMITS", "LimitSettings", "LimitsSettings"]

MAX_LIMITS = 256
"""The most limits one configuration may name."""

Wait = Annotated[float, Field(gt=0, le=MAX_WAIT_RANGE[1], allow_inf_nan=False)]
"""A configured wait is above 0: a fleet whose calls never wait would fail a job at every busy
slot (``client.slot(..., max_wait=0)`` is the API's try-once)."""


class LimitSettings(_Section):
    """One limit, fleet-wide: how many calls hold a slot at once, how many start and how
    many tokens they spend in any minute; how long one may wait."""

    concurrency: Annotated[int, Field(ge=1, le=MAX_CAPACITY)] | None = None
    rpm: Annotated[int, Field(ge=1, le=MAX_CAPACITY)] | None = None
    tpm: Annotated[int, Field(ge=1, le=MAX_UNITS)] | None = None
    max_wait: Wait | None = None  # None: the section's
    adaptive: bool = False
    min_concurrency: Annotated[int, Field(ge=1, le=MAX_CAPACITY)] | None = None

    @model_validator(mode="after")
    def _some_limit(self) -> LimitSettings:
        if self.concurrency is None and self.rpm is None and self.tpm is None:
            raise ValueError("a limit needs concurrency, rpm, tpm or several")
        if self.adaptive and self.concurrency is None:
            raise ValueError("adaptive needs a concurrency to adapt below")
        if self.min_concurrency is not None:
            if not self.adaptive:
                raise ValueError("min_concurrency is the floor of an adaptive limit: add adaptive")
            if self.concurrency is not None and self.min_concurrency > self.concurrency:
                raise ValueError(
                    f"min_concurrency {self.min_concurrency} is above concurrency "
                    f"{self.concurrency}"
                )
        return self


class LimitsSettings(_Section):
    """Every limit (``each``, keyed by name) and the default ``max_wait``."""

    max_wait: Wait = DEFAULT_MAX_WAIT
    each: dict[str, LimitSettings] = Field(default_factory=dict, max_length=MAX_LIMITS)

    @model_validator(mode="before")
    @classmethod
    def _tables_are_limits(cls, data: Any) -> Any:
        """A table under ``[limits]`` is a limit; the scalars are the section's own."""
        if not isinstance(data, Mapping) or "each" in data:
            return data
        own = {k: v for k, v in data.items() if not isinstance(v, Mapping)}
        return {**own, "each": {k: v for k, v in data.items() if isinstance(v, Mapping)}}

    @model_validator(mode="after")
    def _names(self) -> LimitsSettings:
        seen: set[str] = set()
        for name in self.each:
            normal = url_limit(name) if "://" in name else name
            try:
                check_limit(normal)
            except InputError as exc:
                raise ValueError(str(exc)) from None
            if normal in seen:
                raise ValueError(f"limit {name!r} is given twice (a trailing '/' is the same URL)")
            seen.add(normal)
        return self

    def call_limits(self) -> CallLimits:
        """The limits as the runner takes them."""
        return CallLimits(
            tuple(
                CallLimit(
                    name,
                    entry.concurrency,
                    self.max_wait if entry.max_wait is None else entry.max_wait,
                    rpm=entry.rpm,
                    tpm=entry.tpm,
                    adaptive=entry.adaptive,
                    min_concurrency=entry.min_concurrency or 1,
                )
                for name, entry in sorted(self.each.items())
            )
        )
