"""scripts/gpu-check.sh (issue 37) where there is no GPU: the dry run takes every step's code path on the CPU at tiny
sizes and writes its section to the file it is given, never to bench/RESULTS.md; without --dry-run it refuses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
RESULTS = ROOT / "bench" / "RESULTS.md"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # CUDA hidden: the refusal is checked on a GPU machine too, and the dry run is the CPU's whatever the machine
    env = dict(os.environ, NBT_PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.slow  # starts an interpreter (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_refuses_without_cuda_unless_dry_run() -> None:
    proc = _run()
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow  # starts an interpreter (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_dry_run_never_writes_results_md() -> None:
    before = RESULTS.read_bytes()
    proc = _run("--dry-run", "--out", str(RESULTS))
    assert proc.returncode == 2, proc.stderr
    assert "never writes bench/RESULTS.md" in proc.stderr
    assert RESULTS.read_bytes() == before


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~2 minutes alone; a suite on the same two cores, or a cold inductor cache, triples it
def test_dry_run_reports_every_step(tmp_path: Path) -> None:
    before = RESULTS.read_bytes()
    out = tmp_path / "section.md"
    proc = _run("--dry-run", "--out", str(out), "--logs", str(tmp_path / "logs"))
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-6000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
    section = out.read_text()
    assert section.strip() in proc.stdout  # printed as well as written
    assert re.match(r"## GPU check \d{4}-\d{2}-\d{2} .*\(dry run on the CPU: .+\)\n", section)

    headings = re.findall(r"^### (\d)\. .+? — (.+)$", section, flags=re.M)
    assert [n for n, _ in headings] == [str(n) for n in range(1, 10)], headings
    status = dict(headings)
    for number, text in status.items():
        assert text == "OK" or re.fullmatch(r"SKIPPED: \S.{8,}", text), (number, text)  # a skip says why
    steps = dict(zip("123456789", re.split(r"^### \d\. .*$", section, flags=re.M)[1:], strict=True))

    assert re.search(r"\d+ skipped", steps["1"])  # the gpu tests ran their skip conditions
    assert len(re.findall(r"\*\*\d+\.\d{3}x\*\*", steps["2"])) == 4  # bf16 and fp16 ratios, CNN and decoder
    assert re.search(r"\| fp32 \| \d+ \| \d+ \| \*\*\d+\.\d{3}\*\* \|", steps["3"])
    assert "seed reference" in steps["4"] and re.search(
        r"\| checkpointing \|.*\d+%.*peak memory 51% of fp32", steps["4"]
    )
    # the planner may not exist yet; torch.compile may find no C compiler: both are skips that say so
    assert status["5"].startswith("SKIPPED: planner not built yet") or re.search(r"\| \*\*\d+\.\d\d\*\* \|", steps["5"])
    assert status["6"].startswith("SKIPPED: compile=True failed") or re.search(
        r"\| compile=True \| [\d.]+ s \|", steps["6"]
    )
    assert re.search(r"\| ddp \| DDP \| gloo \|", steps["7"]) and re.search(r"\| fsdp \| FSDP \| gloo \|", steps["7"])
    assert re.search(r"\*\*1/1 bit-identical\*\*", steps["8"])
    # the panel trained 2 epochs beside the plain Trainer and pushed to its widgets at least once a fit
    assert re.search(
        r"\| TrainerWidget start \+ wait \| [\d.]+ \| \d+ \| \*\*\d+\.\d{3}x\*\* .*\| [1-9]\d*-\d+ \|", steps["9"]
    )
    assert re.search(r"Target: the panel within 3% of the plain Trainer: (met|\*\*MISSED\*\*)\.", steps["9"])

    assert RESULTS.read_bytes() == before


@pytest.mark.slow  # starts interpreters (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_an_uninstalled_tree_gets_nbtrainer_widgets_for_the_run_only(tmp_path: Path) -> None:
    """The GPU machine runs the tree on PYTHONPATH, not installed: its first H200 run's panel step died on "No module
    named 'nbtrainer.widgets'". Here a python without site-packages (so without this venv's editable install) runs a
    copy of the tree whose bench/gpu_check.py reports where nbtrainer.widgets resolves, and exits 3."""
    import shutil

    tree = tmp_path / "tree"
    for folder in ("nbtrainer", "widgets"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "scripts").mkdir()
    shutil.copy(SCRIPT, tree / "scripts" / "gpu-check.sh")
    (tree / "bench").mkdir()
    (tree / "bench" / "gpu_check.py").write_text(
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('nbtrainer.widgets')\n"
        "print(spec.origin if spec else None)\n"
        "sys.exit(3)\n"
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(NBT_PYTHON=str(python), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=tree, env=env, capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    # the run saw widgets/ through the link, the installed layout (the link is gone now, so the path is compared)
    assert Path(proc.stdout.strip()) == tree / "nbtrainer" / "widgets" / "__init__.py", proc.stdout
    assert not (tree / "nbtrainer" / "widgets").exists() and not (tree / "nbtrainer" / "widgets").is_symlink()


@pytest.mark.slow  # starts an interpreter (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_step_one_runs_its_own_pytest_session_whatever_options_surround_it(tmp_path: Path) -> None:
    """The suite runs the dry run, so a run given PYTEST_ADDOPTS ("-x" to fail early in a loaded trial, "-k" for a
    subset) must not reach step 1's ``pytest -m gpu``: with "-k" it collected nothing and the step failed (exit 5)."""
    out = tmp_path / "section.md"
    env = dict(os.environ, NBT_PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", PYTEST_ADDOPTS="-k no_such_test")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--only", "1", "--out", str(out), "--logs", str(tmp_path / "logs")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"^### 1\. `pytest -m gpu` — OK$", out.read_text(), flags=re.M), out.read_text()
