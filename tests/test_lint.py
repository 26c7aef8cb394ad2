"""The code stays linted and formatted: ruff (rules and format) in pyproject.toml, run as part of the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PATHS = ["nbtrainer", "widgets", "tests", "bench", "examples", "notebooks", "scripts"]


def _ruff() -> list[str]:
    exe = Path(sys.executable).parent / "ruff"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e .[test]", pytrace=False)
    return [found]


def test_ruff_check_is_clean():
    out = subprocess.run(
        [*_ruff(), "check", "--output-format", "concise", *PATHS], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_ruff_format_is_clean():
    out = subprocess.run([*_ruff(), "format", "--check", *PATHS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, "run `ruff format`; unformatted:\n" + out.stdout[-4000:] + out.stderr[-2000:]
