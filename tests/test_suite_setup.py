"""What keeps the suite's CPU down (docs/testing.md, Time) stays in effect: a change that drops it would cost minutes
without failing anything else."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest


def test_the_worker_keeps_what_survived_the_earlier_tests_out_of_the_collectors_sight() -> None:
    # tests/conftest.py freezes what is alive after collection and after each test
    assert gc.get_freeze_count() > 10_000


@pytest.mark.slow  # starts an interpreter (docs/testing.md)
def test_an_interpreter_the_suite_starts_leaves_full_collections_to_the_code_that_asks() -> None:
    code = "import gc, sitecustomize; print(gc.get_threshold()[2], sitecustomize.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    threshold, path = out.stdout.split()
    assert int(threshold) >= 1000 and path.endswith("tests/_site/sitecustomize.py"), out.stdout
