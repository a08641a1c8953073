"""The providers a runner builds for jobs' choices: bounded, never closed while in use, and
a provider object never serves a choice it does not match."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ai_lease.errors import JobSpecError
from ai_lease.job_provider import ProviderChoice
from ai_lease.providers.base import ChatRequest, Completion, Delta
from ai_lease.run.provider_pick import ProviderPicker


class Recorded:
    """A provider that records whether it was closed."""

    def __init__(self, name: str, model: str | None = None, base_url: str | None = None):
        self.name, self.model, self.base_url = name, model, base_url
        self.closed = False

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        yield Delta(text="x", finish_reason="stop")

    async def complete(self, request: ChatRequest) -> Completion:
        return Completion(text="x", finish_reason="stop")

    async def aclose(self) -> None:
        self.closed = True


def _resolver(made: list[Recorded]):  # type: ignore[no-untyped-def]
    def resolve(choice: ProviderChoice):  # type: ignore[no-untyped-def]
        def build() -> Recorded:
            made.append(Recorded(choice.name or "?", choice.model))
            return made[-1]

        return build

    return resolve


async def test_choices_from_outside_keep_a_bounded_number_of_providers_open() -> None:
    """A thousand distinct choices (a model string varied by whoever submits) leave at most
    max_built providers open; the ones retired are closed, the newest kept."""
    made: list[Recorded] = []
    picker = ProviderPicker(_resolver(made), max_built=4)
    for n in range(1000):
        async with picker.using(f"k{n}", ProviderChoice(name="openai", model=f"m{n}"), None):
            pass
    assert len(made) == 1000
    assert len(picker.built) == 4 and len(picker.factories) <= 16
    assert sum(not p.closed for p in made) == 4
    assert all(not p.closed for p in made[-4:])
    await picker.aclose()
    assert all(p.closed for p in made)


async def test_a_provider_in_use_is_never_closed_to_make_room() -> None:
    """While an attempt holds its provider, choices that come after it retire others (or
    wait for the bound to free), never the one in use."""
    made: list[Recorded] = []
    picker = ProviderPicker(_resolver(made), max_built=2)
    held = ProviderChoice(name="openai", model="held")
    async with picker.using("held", held, None) as provider:
        assert isinstance(provider, Recorded)
        for n in range(10):
            async with picker.using(f"k{n}", ProviderChoice(name="openai", model=f"m{n}"), None):
                assert not provider.closed
        assert not provider.closed and held in picker.built
    await picker.aclose()
    assert provider.closed


@pytest.mark.parametrize(
    ("choice", "why"),
    [
        (
            ProviderChoice(name="openai-compatible", base_url="http://other.example:9/v1"),
            "base URL",
        ),
        (ProviderChoice(name="openai-compatible", headers=(("X-Team", "r"),)), "headers"),
        (ProviderChoice(name="openai-compatible", background=True), "background"),
        (ProviderChoice(name="anthropic"), "'openai-compatible' provider object"),
        (ProviderChoice(name="openai-compatible", model="other"), "runs model 'm'"),
    ],
)
def test_a_provider_object_serves_only_the_choice_it_matches(
    choice: ProviderChoice, why: str
) -> None:
    """Without a resolver, the runner's own provider object never answers a job that asks
    for another base URL, headers, background mode, provider or model."""
    own = Recorded("openai-compatible", "m", "http://127.0.0.1:8000/v1")
    with pytest.raises(JobSpecError, match="cannot run here") as caught:
        ProviderPicker().pick("k", choice, own)
    assert why in str(caught.value)


def test_a_provider_object_serves_the_choice_it_matches() -> None:
    """The same name, model and base URL (a trailing slash aside) is served by the object."""
    own = Recorded("openai-compatible", "m", "http://127.0.0.1:8000/v1")
    same = ProviderChoice(name="openai-compatible", model="m", base_url="http://127.0.0.1:8000/v1/")
    assert ProviderPicker().pick("k", same, own) is own


async def test_a_new_choice_while_every_provider_is_in_use_is_not_closed_under_its_job() -> None:
    """All max_built providers held by running attempts, then a new choice: its provider is
    kept open for its own attempt (the bound is exceeded for a while, never a provider closed
    under a job), and the bound is back once attempts end."""
    made: list[Recorded] = []
    picker = ProviderPicker(_resolver(made), max_built=1)
    first = ProviderChoice(name="openai", model="a")
    async with picker.using("a", first, None) as held:
        async with picker.using("b", ProviderChoice(name="openai", model="b"), None) as new:
            assert isinstance(new, Recorded) and not new.closed
            async with picker.using("c", first, None):
                pass  # another attempt ends meanwhile: it must not close `new`
            assert not new.closed and not held.closed  # type: ignore[union-attr]
    assert len(picker.built) == 1
    await picker.aclose()


def test_a_provider_object_that_cannot_say_its_model_serves_no_job_naming_one() -> None:
    """An object with no model of its own would let the server's default model answer a job
    that asked for another: refused; background must match both ways."""
    anonymous = Recorded("openai-compatible")
    with pytest.raises(JobSpecError, match="runs model None"):
        ProviderPicker().pick("k", ProviderChoice(name="openai-compatible", model="m"), anonymous)
    with pytest.raises(JobSpecError, match="background"):
        ProviderPicker().pick(
            "k", ProviderChoice(name="openai-compatible", background=False), _bg()
        )


def _bg() -> Recorded:
    made = Recorded("openai-compatible")
    made.background = True  # type: ignore[attr-defined]
    return made
