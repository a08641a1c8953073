"""Which provider runs a job: the one its spec names
(:class:`~ai_lease.job_provider.ProviderChoice`), or the runner's own.

A runner is given at most one provider object (``Runner(provider=…)``) and, optionally, a
``provider_resolver``: a callable that turns a job's choice into a zero-argument factory of
the provider that serves it (picklable, so that under process isolation a child can build
it), or raises an :class:`~ai_lease.errors.InputError` saying why it cannot (unknown
provider, no key for it, a host its key may not go to). The rules:

- a job that names no provider runs on the runner's provider, as it always did;
- with a resolver, a job that names one runs on the provider built from the resolver's
  factory, one per distinct choice, cached for the runner's life and closed by
  :meth:`ProviderPicker.aclose` (a worker closes them when it stops);
- without a resolver, the runner's provider object serves a job that names its ``name``
  (and, if the object has a ``model``, the same model or none); any other job fails at
  once with a :class:`~ai_lease.errors.JobSpecError` saying which provider it asked for
  and why this runner cannot give it. Nothing answers a job in another provider's place.
"""

from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

from ai_lease.errors import InputError, JobSpecError
from ai_lease.job_provider import ProviderChoice
from ai_lease.providers.base import Provider

__all__ = ["MAX_BUILT", "ProviderPicker", "ProviderResolver"]

ProviderFactory: TypeAlias = Callable[[], Provider]
ProviderResolver: TypeAlias = Callable[[ProviderChoice], ProviderFactory]
"""A job's choice -> a (picklable) factory of its provider; raises InputError when it cannot."""

MAX_BUILT = 16
"""Providers built for jobs' choices kept open at once (each may hold a connection pool)."""


class ProviderPicker:
    """Providers for jobs' choices: resolved, built once per distinct choice, at most
    ``max_built`` kept (least recently used first out, never one in use), closed at the end."""

    def __init__(
        self,
        resolver: ProviderResolver | None = None,
        max_built: int = MAX_BUILT,
        serves: ProviderChoice | None = None,
    ) -> None:
        self.resolver = resolver
        self.serves = serves  # the choice the runner's own provider object was built for
        self.max_built = max_built
        self.factories: OrderedDict[ProviderChoice, ProviderFactory] = OrderedDict()
        self.built: OrderedDict[ProviderChoice, Provider] = OrderedDict()
        self.in_use: Counter[ProviderChoice] = Counter()
        self.retired: list[Provider] = []  # evicted, closed at the next await point

    def pick(
        self, key: str, choice: ProviderChoice | None, default: Provider | None
    ) -> Provider | None:
        """The provider that runs job ``key`` (``default``: the runner's own); raise
        :class:`JobSpecError` if none here can."""
        if choice is None:
            return default
        if (built := self.built.get(choice)) is not None:
            self.built.move_to_end(choice)
            return built
        if self.resolver is None:
            if choice != self.serves:
                _check_serves(key, choice, default)
            return default
        factory = self._resolve(key, choice, self.resolver)
        try:
            provider = factory()
        except InputError as exc:
            raise _unavailable(key, choice, str(exc)) from None
        self.built[choice] = provider
        self._evict(keep=choice)  # never the one just built: its caller is about to use it
        return provider

    @contextlib.asynccontextmanager
    async def using(
        self, key: str, choice: ProviderChoice | None, default: Provider | None
    ) -> AsyncIterator[Provider | None]:
        """:meth:`pick`, held for one attempt: a provider in use is never evicted."""
        provider = self.pick(key, choice, default)
        counted = choice is not None and choice in self.built
        if counted:
            self.in_use[choice] += 1  # type: ignore[index]
        try:
            yield provider
        finally:
            if counted and self.in_use[choice] > 0:  # type: ignore[index]
                self.in_use[choice] -= 1  # type: ignore[index]
                self._evict()
            await self._close_retired()

    def factory(self, key: str, choice: ProviderChoice | None) -> ProviderFactory | None:
        """The factory a child process builds job ``key``'s provider with (None: the
        child's default, which serves jobs naming none, and all jobs without a resolver)."""
        if choice is None or self.resolver is None:
            return None
        return self._resolve(key, choice, self.resolver)

    def _resolve(
        self, key: str, choice: ProviderChoice, resolver: ProviderResolver
    ) -> ProviderFactory:
        if (known := self.factories.get(choice)) is not None:
            self.factories.move_to_end(choice)
            return known
        try:
            made = resolver(choice)
        except InputError as exc:
            raise _unavailable(key, choice, str(exc)) from None
        self.factories[choice] = made
        while len(self.factories) > self.max_built * 4:  # factories are small; still bounded
            self.factories.popitem(last=False)
        return made

    def _evict(self, keep: ProviderChoice | None = None) -> None:
        """Retire the least recently used providers no attempt is using (and not ``keep``),
        down to the bound."""
        idle = [c for c in self.built if not self.in_use[c] and c != keep]
        for choice in idle[: max(0, len(self.built) - self.max_built)]:
            self.retired.append(self.built.pop(choice))
            del self.in_use[choice]

    async def _close_retired(self) -> None:
        retired, self.retired = self.retired, []
        for provider in retired:
            with contextlib.suppress(Exception):
                await provider.aclose()

    async def aclose(self) -> None:
        """Close every provider built here (not the runner's own: its owner closes it)."""
        self.retired.extend(self.built.values())
        self.built, self.factories = OrderedDict(), OrderedDict()
        self.in_use.clear()
        await self._close_retired()


def _check_serves(key: str, choice: ProviderChoice, default: Provider | None) -> None:
    """Raise unless ``default`` is the provider ``choice`` asks for."""
    if default is None:
        raise _unavailable(key, choice, "this runner has no provider")
    no_resolver = (
        "(pass Runner(provider_resolver=…), or run the job where that provider is configured)"
    )
    if choice.name is not None and choice.name != default.name:
        raise _unavailable(
            key,
            choice,
            f"this runner was given a {default.name!r} provider object and no provider "
            f"resolver {no_resolver}",
        )
    model = getattr(default, "model", None)
    if choice.model is not None and model != choice.model:  # None: it cannot say which
        raise _unavailable(
            key, choice, f"this runner's {default.name!r} provider runs model {model!r}"
        )
    base_url = getattr(default, "base_url", None)
    if choice.base_url is not None and (
        not isinstance(base_url, str) or base_url.rstrip("/") != choice.base_url.rstrip("/")
    ):
        raise _unavailable(
            key,
            choice,
            f"this runner's {default.name!r} provider object does not call that base URL "
            f"(or does not say which it calls) {no_resolver}",
        )
    background = bool(getattr(default, "background", False))
    if choice.headers or (choice.background is not None and choice.background != background):
        raise _unavailable(
            key,
            choice,
            f"a provider object cannot take a job's headers or background setting {no_resolver}",
        )


def _unavailable(key: str, choice: ProviderChoice, why: str) -> JobSpecError:
    return JobSpecError(
        f"job {key!r} asks for provider {choice.describe()}, which cannot run here: {why}"
    )
