"""The public API is one curated front door."""

import ai_lease


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted, every name in it exists, and no public name is missing from it."""
    names = ai_lease.__all__
    assert names == sorted(names)
    assert all(hasattr(ai_lease, n) for n in names)
    public = {
        n
        for n, v in vars(ai_lease).items()
        if not n.startswith("_") and getattr(v, "__module__", "").startswith("ai_lease")
    }
    assert public <= set(names)
