"""Installing nbtrainer into Google Colab's environment changes none of Colab's packages (issue 45).

Runs in the colab profile's venv (constraints-colab.txt: ipywidgets 7.7.1, ipykernel 6.17.1, IPython 7.34, bqplot
0.12.47, Notebook 6.5 ... at Colab's versions), where ``scripts/test.sh`` runs tests/widgets a second time. pip
resolves ``pip install <this repository>`` (what ``pip install nbtrainer`` does) against that environment
(``--dry-run --report``: what it would install or upgrade) with the index and build isolation of a user's install.
A negative control (``ipywidgets>=8``) shows the report names an upgrade when there is one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _venvs import clean_env

ipywidgets = pytest.importorskip("ipywidgets")
if int(ipywidgets.__version__.split(".")[0]) >= 8:
    pytest.skip("runs in the colab profile's venv (bash scripts/venv.sh colab)", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
# Colab's widget and kernel stack, and what Colab warns must not be upgraded under its runtime
COLAB_OWN = (
    "ipywidgets",
    "ipykernel",
    "ipython",
    "bqplot",
    "jupyter-client",
    "widgetsnbextension",
    "notebook",
    "traitlets",
    "tornado",
    "pyzmq",
)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def _would_install(tmp_path: Path, *requirements: str) -> dict[str, str]:
    """name -> version of what ``pip install requirements`` would install or replace here."""
    report = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    items = json.loads(report.read_text())["install"]
    return {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_installing_nbtrainer_on_colabs_stack_changes_none_of_its_packages(tmp_path: Path) -> None:
    from importlib.metadata import version

    before = {name: version(name) for name in COLAB_OWN}
    assert before["ipywidgets"] == "7.7.1" and before["ipykernel"] == "6.17.1" and before["bqplot"] == "0.12.47"
    changes = _would_install(tmp_path, str(REPO))
    assert "nbtrainer" in changes  # the project itself, nothing of Colab's
    touched = {name: f"{before[name]} -> {changes[name]}" for name in COLAB_OWN if name in changes}
    assert not touched, f"installing nbtrainer would change Colab's packages: {touched}"
    # the control: a requirement Colab's stack does not meet shows up in the same report
    assert _would_install(tmp_path, "ipywidgets>=8").get("ipywidgets", "").startswith("8.")
    # and the environment as installed (the project in it) has no broken requirement
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, env=clean_env())
    assert check.returncode == 0, check.stdout + check.stderr
