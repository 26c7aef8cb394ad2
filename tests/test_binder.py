"""The Binder config cannot rot silently.

repo2docker (mybinder.org) runs ``pip install -r binder/requirements.txt`` from the repository root.
Here the non-torch lines are installed the same way (cwd = repo root, so ``-e .`` is the project) into
a fresh venv, offline: a ``.pth`` file appends the dev venv's site-packages after the new venv's own, so
requirements are "already satisfied" instead of downloaded, and ``--no-deps --no-index`` keeps pip off
the network. Then ``nbtrainer`` and ``nbtrainer.widgets`` are imported from outside the repo.

The torch line is checked statically: a pinned ``+cpu`` build from PyTorch's CPU wheel index, the
same version as the dev pin in constraints.txt. The README must carry a Binder badge that opens
JupyterLab on the quickstart notebook, and that notebook must exist.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from _venvs import clean_env as _clean_env
from _venvs import make_overlay_venv
from _venvs import run as _run

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"
REQUIREMENTS = BINDER / "requirements.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
QUICKSTART = "notebooks/01_quickstart.ipynb"

_INDEX_OPTS = ("--extra-index-url", "--index-url", "-i", "--find-links", "-f", "--trusted-host")


def _lines(path: Path) -> list[str]:
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line:
            out.append(line)
    return out


def _option(line: str) -> tuple[str, str] | None:
    """``--opt value`` / ``--opt=value`` -> (opt, value); None for a requirement line."""
    if not line.startswith("-"):
        return None
    m = re.match(r"^(-{1,2}[\w-]+)(?:\s*=\s*|\s+)(.*)$", line)
    return (m.group(1), m.group(2).strip()) if m else (line, "")


def _is_torch(line: str) -> bool:
    return re.match(r"^torch\s*(?:[=<>!~\[;@]|$)", line) is not None


def test_torch_is_the_pinned_cpu_build_from_the_cpu_index() -> None:
    lines = _lines(REQUIREMENTS)
    indexes = [v for opt, v in filter(None, map(_option, lines)) if opt in ("--extra-index-url", "--index-url", "-i")]
    assert [u.rstrip("/") for u in indexes] == [CPU_INDEX], indexes

    torch_lines = [ln for ln in lines if _is_torch(ln)]
    assert len(torch_lines) == 1, torch_lines
    m = re.fullmatch(r"torch\s*==\s*(\d+\.\d+\.\d+)\+cpu", torch_lines[0])
    assert m, f"torch must be pinned to a +cpu build, got {torch_lines[0]!r}"

    # Same version as the dev/CI pin, so Binder runs what the tests ran.
    pins = [ln for ln in _lines(REPO / "constraints.txt") if _is_torch(ln)]
    assert pins, "constraints.txt pins no torch"
    dev = re.search(r"==\s*([\w.]+?)(?:\+\w+)?$", pins[0])
    assert dev and dev.group(1) == m.group(1), (pins[0], torch_lines[0])

    # The project itself (a binder/ folder stops repo2docker from installing the root pyproject).
    assert any(re.fullmatch(r"(?:-e|--editable)\s+\.(\[[\w,\s-]+\])?", ln) for ln in lines), lines
    assert any(re.match(r"^jupyterlab\b", ln) for ln in lines), lines


def test_runtime_python_satisfies_requires_python() -> None:
    runtime = BINDER / "runtime.txt"
    if not runtime.exists():
        pytest.skip("no binder/runtime.txt: repo2docker's default Python is used")
    m = re.fullmatch(r"python-(\d+)\.(\d+)", runtime.read_text().strip())
    assert m, runtime.read_text()
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.search(r">=\s*(\d+)\.(\d+)", requires)
    assert low and (int(m.group(1)), int(m.group(2))) >= (int(low.group(1)), int(low.group(2))), requires


def test_readme_has_binder_badge_to_quickstart_in_lab() -> None:
    readme = REPO / "README.md"
    assert readme.exists(), "README.md is missing"
    text = readme.read_text()
    urls = re.findall(r"\]\((https://mybinder\.org/v2/[^)\s]+)\)", text)
    assert urls, "README has no Binder badge link (https://mybinder.org/v2/...)"
    badge = re.search(r"\[!\[[^\]]*\]\(https://mybinder\.org/badge[^)]*\)\]\(https://mybinder\.org/v2/", text)
    assert badge, "the Binder link is not a badge ([![Binder](https://mybinder.org/badge_logo.svg)](...))"
    urlpaths = [unquote(p) for u in urls for p in parse_qs(urlsplit(u).query).get("urlpath", [])]
    assert f"lab/tree/{QUICKSTART}" in urlpaths, urls
    assert (REPO / QUICKSTART).exists(), f"the Binder badge opens {QUICKSTART}, which does not exist"


# -- the install, as repo2docker does it -------------------------------------------------------


@pytest.mark.slow
def test_binder_requirements_install_the_project(tmp_path: Path) -> None:
    kept = []
    for line in _lines(REQUIREMENTS):
        opt = _option(line)
        if _is_torch(line) or (opt and opt[0] in _INDEX_OPTS):
            continue  # torch comes from the dev venv; no index is contacted
        kept.append(line)
    assert any(re.match(r"(?:-e|--editable)\s+\.", ln) for ln in kept), kept
    reqs = tmp_path / "binder-requirements.txt"
    reqs.write_text("\n".join(kept) + "\n")

    py, site = make_overlay_venv(tmp_path / "venv")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ctrl = subprocess.run(
        [str(py), "-c", "import nbtrainer"], cwd=outside, env=_clean_env(), capture_output=True, text=True
    )
    assert ctrl.returncode != 0 and "No module named 'nbtrainer'" in ctrl.stderr, ctrl.stderr

    # repo2docker: `pip install --no-cache-dir -r binder/requirements.txt`, cwd = the repository root.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-cache-dir",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-r",
            str(reqs),
        ],
        cwd=REPO,
    )

    probe = textwrap.dedent(
        """
        import json, sys
        import nbtrainer, nbtrainer.widgets
        print(json.dumps({"nbtrainer": nbtrainer.__file__, "widgets": nbtrainer.widgets.__file__,
                          "version": nbtrainer.__version__}))
        """
    )
    info = json.loads(_run([str(py), "-c", probe], cwd=outside).stdout.strip().splitlines()[-1])
    assert Path(info["nbtrainer"]).resolve() == (REPO / "nbtrainer" / "__init__.py").resolve(), info
    assert Path(info["widgets"]).resolve() == (REPO / "widgets" / "__init__.py").resolve(), info
    assert list(site.glob("nbtrainer-*.dist-info")), "the editable install left no metadata in the new venv"
