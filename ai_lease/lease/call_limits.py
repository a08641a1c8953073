"""Which provider slots a model call must hold: the ``[limits]`` settings as values.

A limit is named by what it limits: ``"<provider>:<model>"`` (one model of one provider, the
provider named as its adapter calls itself: ``openai``, ``openai-compatible``, ``anthropic``
…), ``"<provider>"`` (every model of it), or a base URL (``"http://10.0.0.5:8080/v1"``: one
server, whichever model a job names). A call holds one slot of **every** limit that
matches it, taken in the order of their names, so two calls never wait on each other
crosswise.

>>> limits = CallLimits((CallLimit("openai:gpt-4o-mini", 4), CallLimit("openai", 10)))
>>> [limit.name for limit in limits.matching("openai", "gpt-4o-mini", None)]
['openai', 'openai:gpt-4o-mini']
>>> limits.matching("anthropic", "claude", None)
()
"""

from __future__ import annotations

from dataclasses import dataclass

from ai_lease.errors import InputError
from ai_lease.lease.slots import MAX_CAPACITY, check_limit, check_seconds

__all__ = [
    "DEFAULT_MAX_WAIT",
    "MAX_WAIT_RANGE",
    "RATE_WINDOW_S",
    "CallLimit",
    "CallLimits",
    "url_limit",
]

DEFAULT_MAX_WAIT = 60.0
"""Seconds a model call waits for a slot before its job fails (``limits.max_wait``)."""

MAX_WAIT_RANGE = (0.0, 86_400.0)
"""The ``max_wait`` a limit may have (seconds)."""

RATE_WINDOW_S = 61.0
"""How long one request's place in an ``rpm`` window is kept (seconds): a minute, and one
second for the network's and the clocks' jitter, so that a server counting arrivals in its own
minute never sees more than ``rpm``."""


def url_limit(base_url: str) -> str:
    """The limit name of a server: its base URL without a trailing slash.

    >>> url_limit("http://127.0.0.1:8080/v1/")
    'http://127.0.0.1:8080/v1'
    """
    return base_url.strip().rstrip("/")


@dataclass(frozen=True, slots=True)
class CallLimit:
    """One limit, shared by every process on the store: ``concurrency`` calls at once (each
    holds a slot while it runs), and or ``rpm`` calls started in any minute (each takes a
    place in the window that lapses :data:`RATE_WINDOW_S` later, never given back); a call
    waits at most ``max_wait`` seconds for them (then its job fails, saying so)."""

    name: str
    concurrency: int | None = None
    max_wait: float = DEFAULT_MAX_WAIT
    rpm: int | None = None

    def __post_init__(self) -> None:
        name = check_limit(url_limit(self.name) if "://" in self.name else self.name)
        object.__setattr__(self, "name", name)
        for field, value in (("concurrency", self.concurrency), ("rpm", self.rpm)):
            if value is None:
                continue
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not 1 <= value <= MAX_CAPACITY
            ):
                raise InputError(
                    f"limit {name!r}: {field} {value!r:.40} is not in 1..{MAX_CAPACITY}"
                )
        if self.concurrency is None and self.rpm is None:
            raise InputError(f"limit {name!r}: give concurrency, rpm or both")
        check_limit(self.rate_name or name)  # the window's name fits too
        wait = check_seconds(name, "max_wait", self.max_wait, *MAX_WAIT_RANGE)
        object.__setattr__(self, "max_wait", wait)

    @property
    def rate_name(self) -> str | None:
        """The store's name of the ``rpm`` window (None: no rpm): the limit's, ``~rpm`` after."""
        return None if self.rpm is None else f"{self.name}~rpm"


@dataclass(frozen=True, slots=True)
class CallLimits:
    """Every configured limit (none: a model call takes no slot and costs nothing)."""

    limits: tuple[CallLimit, ...] = ()

    def __post_init__(self) -> None:
        names = [limit.name for limit in self.limits]
        if len(set(names)) != len(names):
            raise InputError(f"limits: a name is given twice in {names}")

    def __bool__(self) -> bool:
        return bool(self.limits)

    def matching(
        self, provider: str | None, model: str | None, base_url: str | None
    ) -> tuple[CallLimit, ...]:
        """The limits a call of ``provider`` / ``model`` to ``base_url`` holds a slot of,
        in the order they are taken (by name)."""
        if not self.limits:
            return ()
        names = set()
        if provider:
            names.add(provider)
            if model:
                names.add(f"{provider}:{model}")
        if base_url:
            names.add(url_limit(base_url))
        return tuple(sorted((x for x in self.limits if x.name in names), key=lambda x: x.name))
