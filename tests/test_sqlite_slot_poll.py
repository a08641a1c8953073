"""On SQLite a slot's waiters poll (no push between processes): the one first in line looks
every 50 ms even with the default 1 s ``poll_interval``, so a one-slot limit hands over
without a second's gap per call; waiters further back look ``ahead + 1`` times less often,
so a long line does not load the file."""

from __future__ import annotations

from pathlib import Path

from ai_lease.stores.sqlite.slots import SLOT_POLL_S
from ai_lease.stores.sqlite.store import SQLiteStore

REAL_TIME = "the waiter sleeps between looks in real time; counts are bounded generously"

LIMIT = "local:llama"


async def _looks(store: SQLiteStore, timeout: float, ahead: int) -> int:
    """How many times one wait reads the file."""
    file = store.slots._file
    real, looks = file._run, 0

    async def counting(name: str, fn: object) -> object:
        nonlocal looks
        looks += name == "wait_slot"
        return await real(name, fn)  # type: ignore[arg-type]

    file._run = counting  # type: ignore[method-assign]
    try:
        await store.wait_slot(LIMIT, timeout, ahead=ahead)
    finally:
        file._run = real  # type: ignore[method-assign]
    return looks


async def test_first_in_line_looks_often_the_line_behind_less(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "s.db"), poll_interval=1.0)
    try:
        first = await _looks(store, 1.0, ahead=0)
        tenth = await _looks(store, 1.0, ahead=9)
    finally:
        await store.aclose()
    # 1 s at 50 ms: about 20 looks (a busy machine makes fewer); at 500 ms: 1 first + 2
    assert 1 / SLOT_POLL_S / 3 <= first <= 1 / SLOT_POLL_S + 2, first
    assert tenth <= 3, tenth
