"""``local-extractive``: an offline, deterministic stand-in for a model. It is NOT a model.

It answers with an extractive summary of the prompt's input — the highest-scoring sentences
by word frequency, in their original order — streamed word by word with a steady pace, so
the whole pipeline (lease, progress per chunk, stream timeouts) runs for real on a machine
with no network and no API key.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator

from .base import ChatRequest, Completion, Delta, Usage

__all__ = ["LocalExtractiveProvider", "extractive_summary"]

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_INPUT = re.compile(r"<input>\n(.*?)\n</input>", re.DOTALL)
_HOW_MANY = re.compile(r"\bin (\d{1,2}) sentences?\b")


def extractive_summary(text: str, sentences: int = 3) -> str:
    """The ``sentences`` most representative sentences of ``text``, in their original order."""
    parts = [s for s in _SENTENCE.split(" ".join(text.split())) if s]
    if len(parts) <= sentences:
        return " ".join(parts)
    freq = Counter(w.lower() for w in _WORD.findall(text))

    def score(sentence: str) -> float:
        words = [w.lower() for w in _WORD.findall(sentence)]
        return sum(freq[w] for w in words) / (len(words) + 2) if words else 0.0

    best = sorted(range(len(parts)), key=lambda i: (-score(parts[i]), i))[:sentences]
    return " ".join(parts[i] for i in sorted(best))


class LocalExtractiveProvider:
    """Summarises the text between the last ``<input>`` and ``</input>`` lines of the last
    user message (or the whole message), streaming it one word per ``pace_s`` seconds.
    An instruction before the input saying "in N sentences" sets the length."""

    name = "local-extractive"

    def __init__(self, *, sentences: int = 3, pace_s: float = 0.02) -> None:
        self.sentences, self.pace_s = sentences, pace_s

    def _answer(self, request: ChatRequest) -> tuple[str, int]:
        prompt = request.messages[-1]["content"] if request.messages else ""
        found = _INPUT.findall(prompt)
        asked = _HOW_MANY.search(prompt.rsplit("<input>\n", 1)[0])
        count = int(asked.group(1)) if asked else self.sentences
        summary = extractive_summary(found[-1] if found else prompt, max(1, count))
        return summary, len(prompt.split())

    async def stream(self, request: ChatRequest) -> AsyncIterator[Delta]:
        summary, prompt_words = self._answer(request)
        words = summary.split(" ")
        for i, word in enumerate(words):
            if self.pace_s:
                await asyncio.sleep(self.pace_s)
            yield Delta(text=word if i == 0 else " " + word)
        yield Delta(finish_reason="stop")
        yield Delta(usage=Usage(prompt_tokens=prompt_words, completion_tokens=len(words)))

    async def complete(self, request: ChatRequest) -> Completion:
        summary, prompt_words = self._answer(request)
        words = len(summary.split())
        return Completion(summary, "stop", Usage(prompt_words, words))

    async def aclose(self) -> None:
        return None
