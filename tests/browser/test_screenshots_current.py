"""The README's dashboard pictures are the ones the screenshot script takes from real runs
(tests/browser/screenshots.py), and were taken of the pages as they are now."""

from __future__ import annotations

import re

from tests.browser.screenshots import DIGEST, PICTURES, REPO_ROOT, pages_digest

IMG = REPO_ROOT / "docs" / "img"


def test_the_readme_shows_only_pictures_the_script_takes() -> None:
    """Every docs/img picture the README shows is one the screenshot script writes, and
    each of those is there."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"\(docs/img/([^)]+\.png)\)", readme))
    assert shown == set(PICTURES), shown
    assert all((IMG / name).stat().st_size > 10_000 for name in PICTURES)


def test_the_pictures_were_taken_of_the_pages_as_they_are() -> None:
    """docs/img/pages.sha256 is the digest of the page sources now (templates, static
    files, the SVG modules): a page changed without new pictures fails here."""
    recorded = (IMG / DIGEST).read_text(encoding="utf-8").strip() if (IMG / DIGEST).exists() else ""
    assert recorded == pages_digest(), (
        "the dashboard's pages changed since docs/img was shot: run "
        "`.venv/bin/python -m tests.browser.screenshots` and commit docs/img"
    )
