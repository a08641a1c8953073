"""``local-extractive``: an offline, deterministic stand-in for a model. It is NOT a model.

It answers with an extractive summary of the prompt's input — the highest-scoring sentences
by word frequency, in their original order — streamed word by word with a steady pace, so
the whole pipeline (lease, progress per chunk, stream timeouts) runs for real on a machine
with no network and no API key.

It takes the settings every provider takes and ignores what has no meaning offline:
``model`` (it is no model; the record names the job's own ``model`` if the job gives one),
``temperature``, ``max_tokens``, ``headers``, ``connect_timeout`` and ``read_timeout``. A
``base_url`` is refused (:class:`~ai_lease.errors.ConfigError`): it calls no server, so a
base URL means another provider was meant.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from ai_lease.errors import ConfigError
from ai_lease.providers.base import ChatRequest, Completion, Delta, Usage
from ai_lease.redaction import mask_url
from ai_lease.resource import AsyncResource

__all__ = ["LocalExtractiveProvider", "extractive_summary"]

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_HOW_MANY = re.compile(r"\bin (\d{1,2}) sentences?\b")


def _sentences(text: str) -> Iterator[str]:
    """The sentences of ``text``, whitespace collapsed, one small step at a time (so a
    thread running this on a huge text lets the event loop's thread in between)."""
    start = 0
    for match in _SENTENCE.finditer(text):
        if sentence := " ".join(text[start : match.start()].split()):
            yield sentence
        start = match.end()
    if sentence := " ".join(text[start:].split()):
        yield sentence


def extractive_summary(text: str, sentences: int = 3) -> str:
    """The ``sentences`` most representative sentences of ``text``, in their original order."""
    parts = list(_sentences(text))
    if len(parts) <= sentences:
        return " ".join(parts)
    words = [[w.lower() for w in _WORD.findall(part)] for part in parts]
    freq = Counter(w for ws in words for w in ws)

    def score(i: int) -> float:
        return sum(freq[w] for w in words[i]) / (len(words[i]) + 2) if words[i] else 0.0

    scores = [score(i) for i in range(len(parts))]
    best = sorted(range(len(parts)), key=lambda i: (-scores[i], i))[:sentences]
    return " ".join(parts[i] for i in sorted(best))


def _last_input(prompt: str) -> str | None:
    """The text between the last ``<input>`` line and the ``</input>`` line after it."""
    end = prompt.rfind("\n</input>")
    start = prompt.rfind("<input>\n", 0, end) if end >= 0 else -1
    return None if start < 0 else prompt[start + len("<input>\n") : end]


def _text_of(parts: Any) -> str:
    """The text parts of a message's content parts, joined (images are not read)."""
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    return "\n".join(t for t in texts if isinstance(t, str))


class LocalExtractiveProvider(AsyncResource):
    """Summarises the text between the last ``<input>`` and ``</input>`` lines of the last
    user message (or the whole message), streaming it one word per ``pace_s`` seconds.
    An instruction before the input saying "in N sentences" sets the length."""

    name = "local-extractive"

    def __init__(
        self,
        *,
        sentences: int = 3,
        pace_s: float = 0.02,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        base_url: str | None = None,
    ) -> None:
        """``model``, ``temperature``, ``max_tokens``, ``headers`` and the timeouts are
        accepted and ignored (see the module's docstring); a ``base_url`` is refused."""
        if base_url is not None:
            raise ConfigError(
                f"provider.base_url: {self.name!r} is offline and calls no server (got "
                f"{mask_url(base_url)!r}); set provider.name to the provider that serves "
                "that URL, or drop the base URL"
            )
        self.sentences, self.pace_s = sentences, pace_s
        self.ignored_model = model  # not `model`: the record must not name a model that never ran

    def _answer(self, request: ChatRequest) -> tuple[str, int]:
        content = request.messages[-1]["content"] if request.messages else ""
        prompt = content if isinstance(content, str) else _text_of(content)
        found = _last_input(prompt)
        asked = _HOW_MANY.search(prompt.rsplit("<input>\n", 1)[0])
        count = int(asked.group(1)) if asked else self.sentences
        summary = extractive_summary(prompt if found is None else found, max(1, count))
        return summary, len(prompt.split())

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        # Off the event loop: a big input costs seconds of CPU, and the lease keeper
        # sharing this loop must stay free to renew meanwhile.
        summary, prompt_words = await asyncio.to_thread(self._answer, request)
        words = summary.split(" ")
        for i, word in enumerate(words):
            if self.pace_s:
                await asyncio.sleep(self.pace_s)
            yield Delta(text=word if i == 0 else " " + word)
        yield Delta(finish_reason="stop")
        yield Delta(usage=Usage(prompt_tokens=prompt_words, completion_tokens=len(words)))

    async def complete(self, request: ChatRequest) -> Completion:
        summary, prompt_words = await asyncio.to_thread(self._answer, request)
        words = len(summary.split())
        return Completion(summary, "stop", Usage(prompt_words, words))

    async def aclose(self) -> None:
        return None
