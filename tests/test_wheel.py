"""What users install is what is tested: the wheel, in a fresh venv, outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.harness.checkout import checkout_copy

REPO = Path(__file__).resolve().parent.parent


def _run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"{args}: {out.stdout[-2000:]}{out.stderr[-2000:]}"
    return out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_installed_in_a_fresh_venv_runs_the_readme_job(tmp_path: Path) -> None:
    """The built wheel ships the prompts and default config; installed in a fresh venv and
    run from another directory, `ai-lease submit examples/summarize.toml` works."""
    dist = tmp_path / "dist"
    source = checkout_copy(tmp_path)  # pip builds in the tree it is given: not the checkout's
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, source, cwd=tmp_path)
    [wheel] = dist.glob("ai_lease-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "ai_lease/data/prompts/summarize.j2",
        "ai_lease/data/prompts/extract_json.j2",
        "ai_lease/data/ai-lease.toml",
        "ai_lease/ui/templates/jobs.html",
        "ai_lease/ui/templates/_rows.html",
        "ai_lease/ui/static/ui.js",
        "ai_lease/ui/static/ui.css",
    } <= names

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp_path)
    # The dependencies come from this environment (appended after the venv's own
    # site-packages, so ai_lease itself is the wheel's, never the checkout's).
    site = Path(
        _run(
            venv / "bin" / "python",
            "-c",
            "import site; print(site.getsitepackages()[0])",
            cwd=tmp_path,
        ).strip()
    )
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AI_LEASE_", "OPENAI"))}
    env.pop("PYTHONPATH", None)
    where = _run(
        venv / "bin" / "python",
        "-c",
        "import ai_lease; print(ai_lease.__file__)",
        cwd=elsewhere,
        env=env,
    )
    assert where.startswith(str(site)), where
    out = _run(
        venv / "bin" / "ai-lease",
        "submit",
        REPO / "examples" / "summarize.toml",
        "-q",
        cwd=elsewhere,
        env=env,
    )
    assert len(out.strip().split(". ")) == 3, out
    annotated = _run(venv / "bin" / "ai-lease", "config", "--defaults", cwd=elsewhere, env=env)
    assert "[lease]" in annotated and "renew_interval = 5.0" in annotated
