"""A copy of the checkout's tracked files, for what would otherwise write into the checkout
itself (an install, a build): tests running beside each other never see each other's files."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout_copy(parent: Path) -> Path:
    """The tracked files of the checkout, copied into ``parent / "checkout"``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    target = parent / "checkout"
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, copy = ROOT / name, target / name
        if source.is_symlink():  # as git keeps it: a link (ai_lease/data/prompts → prompts/)
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.symlink_to(source.readlink())
        elif source.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    return target
