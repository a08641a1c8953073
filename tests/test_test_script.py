"""scripts/test.sh, the README's test command, on a machine that lacks what the suite needs:
not root, it names every missing Debian package and the one apt-get line, and exits 1 before
it makes a venv or runs a test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the script itself calls before it gets to the missing packages (all on any Debian).
TOOLS = ["bash", "dirname", "ls", "sort", "tail", "tr", "python3", "cat"]


def _bin(tmp_path: Path) -> Path:
    """A PATH with the shell's basics only: no redis-server, no g++, no cmake; and an ``id``
    that says the caller is not root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    fake_id = bin_dir / "id"
    fake_id.write_text("#!/bin/sh\necho 1000\n")
    fake_id.chmod(0o755)
    return bin_dir


def test_not_root_and_packages_missing_it_says_what_to_install(tmp_path: Path) -> None:
    env = {"PATH": str(_bin(tmp_path)), "HOME": str(tmp_path)}
    before = sorted(p.name for p in ROOT.iterdir())
    ran = subprocess.run(
        ["bash", str(ROOT / "scripts" / "test.sh"), "-q", "tests/test_virtual_clock.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        executable=shutil.which("bash"),
    )
    assert ran.returncode == 1, (ran.returncode, ran.stdout, ran.stderr)
    said = ran.stderr
    lines = [line for line in said.splitlines() if "which are not installed:" in line]
    assert len(lines) == 1, said
    named = set(lines[0].split("which are not installed:")[1].split())
    assert {"redis-server", "g++", "cmake"} <= named, said
    assert f"apt-get install -y {lines[0].split('not installed: ')[1]}" in said, said
    assert "== .venv" not in said and "== pytest" not in said, said  # it stopped first
    assert sorted(p.name for p in ROOT.iterdir()) == before  # nothing made in the checkout
