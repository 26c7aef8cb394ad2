"""The code stays linted, formatted and type-checked: ruff (rules and format) and mypy, configured in pyproject.toml,
run as part of the suite."""

from __future__ import annotations

import importlib.util
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


def test_mypy_is_clean():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e .[test]", pytrace=False)
    # tests/_mypy.py is mypy with widgets/ under its installed name, nbtrainer.widgets (see its docstring)
    out = subprocess.run(
        [sys.executable, str(REPO / "tests" / "_mypy.py"), "nbtrainer", "widgets", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,  # a cold cache takes about 80 s on 2 cores, a warm one 2 s
    )
    assert out.returncode == 0, "\n".join(out.stdout.splitlines()[-80:]) + out.stderr[-2000:]  # whole lines
