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

from dataclasses import dataclass, field

from ai_lease.errors import InputError
from ai_lease.lease.slots import MAX_CAPACITY, MAX_UNITS, check_limit, check_seconds

__all__ = [
    "DEFAULT_MAX_WAIT",
    "MAX_WAIT_RANGE",
    "OVERLOADED",
    "RATE_WINDOW_S",
    "AdaptiveCap",
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


OVERLOADED = frozenset({429, 503, 529})
"""The statuses that tell an adaptive limit the provider is overloaded: rate limited, service
unavailable, Anthropic's 529 overloaded."""


def url_limit(base_url: str) -> str:
    """The limit name of a server: its base URL without a trailing slash.

    >>> url_limit("http://127.0.0.1:8080/v1/")
    'http://127.0.0.1:8080/v1'
    """
    return base_url.strip().rstrip("/")


@dataclass(frozen=True, slots=True)
class CallLimit:
    """One limit, shared by every process on the store: ``concurrency`` calls at once (each
    holds a slot while it runs), ``rpm`` calls started in any minute (each takes a place in
    the window that lapses :data:`RATE_WINDOW_S` later, never given back) and ``tpm`` tokens
    in any minute (a place weighing the request's estimate, set to its usage once the answer
    ends); any one or more of them. A call waits at most ``max_wait`` seconds for them (then
    its job fails, saying so).

    ``adaptive``: the concurrency this process asks for moves between ``min_concurrency``
    and ``concurrency`` (:class:`AdaptiveCap`: one more per round of calls that succeed,
    halved when one is refused as overloaded)."""

    name: str
    concurrency: int | None = None
    max_wait: float = DEFAULT_MAX_WAIT
    rpm: int | None = None
    adaptive: bool = False
    min_concurrency: int = 1
    tpm: int | None = None

    def __post_init__(self) -> None:
        name = check_limit(url_limit(self.name) if "://" in self.name else self.name)
        object.__setattr__(self, "name", name)
        counts = (
            ("concurrency", self.concurrency, MAX_CAPACITY),
            ("rpm", self.rpm, MAX_CAPACITY),
            ("tpm", self.tpm, MAX_UNITS),
        )
        for which, value, top in counts:
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
                raise InputError(f"limit {name!r}: {which} {value!r:.40} is not in 1..{top}")
        if self.concurrency is None and self.rpm is None and self.tpm is None:
            raise InputError(f"limit {name!r}: give concurrency, rpm, tpm or several")
        if self.adaptive and self.concurrency is None:
            raise InputError(f"limit {name!r}: adaptive needs a concurrency to adapt below")
        low = self.min_concurrency
        if (
            isinstance(low, bool)
            or not isinstance(low, int)
            or not 1 <= low <= (self.concurrency or 1)
        ):
            raise InputError(
                f"limit {name!r}: min_concurrency {low!r:.40} is not in 1..{self.concurrency or 1}"
            )
        check_limit(f"{name}~rpm")  # the windows' names fit too
        wait = check_seconds(name, "max_wait", self.max_wait, *MAX_WAIT_RANGE)
        object.__setattr__(self, "max_wait", wait)

    @property
    def rate_name(self) -> str | None:
        """The store's name of the ``rpm`` window (None: no rpm): the limit's, ``~rpm`` after."""
        return None if self.rpm is None else f"{self.name}~rpm"

    @property
    def tokens_name(self) -> str | None:
        """The store's name of the ``tpm`` window (None: no tpm): the limit's, ``~tpm`` after."""
        return None if self.tpm is None else f"{self.name}~tpm"

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the store keeps this limit under: its slots, its windows."""
        slots = (self.name,) if self.concurrency is not None else ()
        return slots + tuple(n for n in (self.rate_name, self.tokens_name) if n)


class AdaptiveCap:
    """The concurrency one process asks of an adaptive limit, AIMD: it starts at the
    configured ``ceiling``; a round of calls that succeed (as many as the cap) adds one; a call
    refused as overloaded (:data:`OVERLOADED`) halves it, never below ``floor``. Calls sent
    before the last halving cannot halve it again (one overload is seen by every call in flight
    at once): a call notes :attr:`epoch` when it starts and passes it back.

    >>> cap = AdaptiveCap(8, 1)
    >>> cap.overloaded(cap.epoch), cap.overloaded(0), cap.capacity
    (True, False, 4)
    >>> [cap.succeeded() for _ in range(4)][-1], cap.capacity
    (True, 5)
    """

    def __init__(self, ceiling: int, floor: int) -> None:
        self.ceiling, self.floor = ceiling, floor
        self.current, self.epoch = float(ceiling), 0

    @property
    def capacity(self) -> int:
        """The slots this process may see taken, its own call included."""
        return max(self.floor, min(self.ceiling, int(self.current)))

    def succeeded(self) -> bool:
        """A call under the limit succeeded: a little more (one per round). True when the
        capacity changed."""
        before = self.capacity
        self.current = min(float(self.ceiling), self.current + 1 / self.capacity)
        return self.capacity != before

    def overloaded(self, epoch: int) -> bool:
        """A call started at ``epoch`` was refused as overloaded: halve, unless a call sent
        after it already did. True when the capacity changed."""
        if epoch != self.epoch:
            return False
        before = self.capacity
        self.current = max(float(self.floor), self.current / 2)
        self.epoch += 1
        return self.capacity != before


@dataclass(frozen=True, slots=True)
class CallLimits:
    """Every configured limit (none: a model call takes no slot and costs nothing), and this
    process's :class:`AdaptiveCap` of each adaptive one (:meth:`cap`)."""

    limits: tuple[CallLimit, ...] = ()
    caps: dict[str, AdaptiveCap] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [limit.name for limit in self.limits]
        if len(set(names)) != len(names):
            raise InputError(f"limits: a name is given twice in {names}")
        caps = {
            x.name: AdaptiveCap(x.concurrency, x.min_concurrency)
            for x in self.limits
            if x.adaptive and x.concurrency is not None
        }
        object.__setattr__(self, "caps", caps)

    def cap(self, limit: CallLimit) -> AdaptiveCap | None:
        """This process's adaptive concurrency of ``limit`` (None: not adaptive)."""
        return self.caps.get(limit.name)

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
