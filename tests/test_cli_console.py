"""The CLI's live view: what it keeps of a streamed answer is bounded, so a long answer
costs linear time and constant memory, and what it shows is the answer's true tail."""

from __future__ import annotations

import io
import tracemalloc

from ai_lease.cli.console import TAIL_CHARS, JobView


def test_view_keeps_the_true_tail_of_a_long_stream() -> None:
    """After many chunks the view holds exactly the last TAIL_CHARS characters."""
    view = JobView("k", live=False, out=io.StringIO())
    chunks = [f"<{i:06d}>" for i in range(20_000)]
    for chunk in chunks:
        view.on_text(chunk)
    assert view.text == "".join(chunks)[-TAIL_CHARS:]
    assert view.chunks == len(chunks)


def test_view_memory_stays_bounded_however_long_the_answer() -> None:
    """20 MB streamed in 1 KB chunks (and one 5 MB chunk) never holds more than a few KB:
    a view that accumulates the text (`+=` per chunk, quadratic copying) holds it all."""
    view = JobView("k", live=False, out=io.StringIO())
    chunk = "x" * 1024
    tracemalloc.start()
    try:
        for _ in range(20_000):
            view.on_text(chunk)
        view.on_text("y" * 5_000_000)
        _, peak = tracemalloc.get_traced_memory()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(view.text) == TAIL_CHARS and view.text == "y" * TAIL_CHARS
    assert held < 1_000_000, held
    assert peak < 12_000_000, peak  # the 5 MB chunk itself, not 25 MB of accumulated text


def test_a_new_stream_starts_an_empty_tail() -> None:
    """reset_text (a new streamed attempt) empties what is shown."""
    view = JobView("k", live=False, out=io.StringIO())
    view.on_text("old answer")
    view.reset_text()
    view.on_text("new")
    assert view.text == "new"
