"""The offline local-extractive provider: a deterministic summary, streamed word by word."""

from __future__ import annotations

import asyncio

import pytest

from ai_lease.prompts import PromptLibrary
from ai_lease.providers.base import ChatRequest, Delta, Provider
from ai_lease.providers.local import LocalExtractiveProvider, extractive_summary
from ai_lease.testing.clock import on_virtual_time

TEXT = (
    "Solar panels turn sunlight into electricity. "
    "The weather was pleasant on Tuesday. "
    "Modern solar panels convert about a fifth of sunlight into electricity! "
    "My neighbour owns a red bicycle. "
    "Cheap solar electricity changes how cities buy electricity? "
    "Lunch was served at noon."
)


def request(content: str) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": content}])


def test_summary_is_deterministic() -> None:
    """The same text always gives the same summary."""
    assert {extractive_summary(TEXT) for _ in range(5)} == {extractive_summary(TEXT)}


def test_summary_keeps_original_order_and_sentences() -> None:
    """The chosen sentences are whole sentences of the text, in the order they appeared."""
    summary = extractive_summary(TEXT, sentences=3)
    sentences = [
        "Solar panels turn sunlight into electricity.",
        "The weather was pleasant on Tuesday.",
        "Modern solar panels convert about a fifth of sunlight into electricity!",
        "My neighbour owns a red bicycle.",
        "Cheap solar electricity changes how cities buy electricity?",
        "Lunch was served at noon.",
    ]
    chosen = [s for s in sentences if s in summary]
    assert " ".join(chosen) == summary
    assert chosen == [s for s in sentences if s in chosen]  # original order
    assert len(chosen) == 3
    # The three sentences about the text's main words win over the off-topic ones.
    assert chosen == [sentences[0], sentences[2], sentences[4]]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 6, 10])
def test_summary_has_at_most_n_sentences(n: int) -> None:
    """extractive_summary returns at most the requested number of sentences."""
    summary = extractive_summary(TEXT, sentences=n)
    count = sum(summary.count(end) for end in ".!?")
    assert count == min(n, 6)


def test_short_text_is_returned_whole() -> None:
    """Text with no more sentences than asked for comes back as it was (whitespace tidied)."""
    assert extractive_summary("  One.  Two!  ", sentences=3) == "One. Two!"
    assert extractive_summary("", sentences=3) == ""


def test_is_a_provider() -> None:
    """LocalExtractiveProvider satisfies the Provider protocol."""
    assert isinstance(LocalExtractiveProvider(), Provider)


async def test_streams_word_by_word_and_matches_complete() -> None:
    """The stream is one word per content delta and joins to exactly complete()'s text."""
    provider = LocalExtractiveProvider(pace_s=0)
    deltas: list[Delta] = [d async for d in provider.stream(request(TEXT))]
    texts = [d.text for d in deltas if d.text]
    completion = await provider.complete(request(TEXT))
    assert "".join(texts) == completion.text == extractive_summary(TEXT)
    assert len(texts) == len(completion.text.split(" "))
    assert all(" " not in t.strip() for t in texts)
    assert all(t.startswith(" ") for t in texts[1:])
    assert [d.finish_reason for d in deltas if d.finish_reason] == ["stop"]
    usage = [d.usage for d in deltas if d.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == len(texts)


@pytest.mark.parametrize(
    "text", ["One line\nspread over two.  Double  spaced. Third one here.", "Word.", ""]
)
async def test_stream_joins_to_complete_for_awkward_whitespace(text: str) -> None:
    """Newlines and double spaces inside sentences survive streaming unchanged."""
    provider = LocalExtractiveProvider(pace_s=0, sentences=2)
    streamed = "".join([d.text async for d in provider.stream(request(text))])
    assert streamed == (await provider.complete(request(text))).text


@on_virtual_time
async def test_stream_paces_its_words() -> None:
    """With a pace set, the words arrive no faster than one per pace_s (it paces on the
    loop's timers, so the loop's virtual clock measures it)."""
    provider = LocalExtractiveProvider(pace_s=0.01, sentences=1)
    clock = asyncio.get_running_loop().time
    started = clock()
    words = [d.text async for d in provider.stream(request("Alpha beta gamma delta epsilon."))]
    assert clock() - started >= 0.01 * 5 * 0.9
    assert "".join(words) == "Alpha beta gamma delta epsilon."


async def test_reads_the_last_input_block_of_the_prompt() -> None:
    """Only the text between the last <input> and </input> lines is summarised."""
    prompt = (
        "Earlier example:\n<input>\nIgnore this example text entirely.\n</input>\n"
        "Now the real one:\n<input>\nThe real text.\n</input>\n"
    )
    completion = await LocalExtractiveProvider().complete(request(prompt))
    assert completion.text == "The real text."


async def test_instruction_line_mentioning_input_tags_is_not_read_as_input() -> None:
    """The shipped summarize prompt mentions <input> in its instructions; only the block counts."""
    prompt = PromptLibrary().render("summarize", {"input": TEXT, "sentences": 2})
    assert prompt.count("<input>") == 2
    provider = LocalExtractiveProvider(sentences=2, pace_s=0)
    completion = await provider.complete(request(prompt))
    assert completion.text == extractive_summary(TEXT, sentences=2)
    assert "Summarise" not in completion.text


async def test_prompt_without_input_block_is_summarised_whole() -> None:
    """With no <input> block the whole last user message is the text."""
    completion = await LocalExtractiveProvider(sentences=2).complete(request(TEXT))
    assert completion.text == extractive_summary(TEXT, sentences=2)


async def test_only_the_last_message_is_read() -> None:
    """A system message before the user message is not part of the text."""
    req = ChatRequest(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Only this."}]
    )
    assert (await LocalExtractiveProvider().complete(req)).text == "Only this."
