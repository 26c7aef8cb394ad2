"""Packaging: the wheel installs ``widgets/`` as ``nbtrainer.widgets`` and the core stays Jupyter-free.

(a) Build the wheel from a copy of the repository, install it into a fresh venv and import
    ``nbtrainer`` / ``nbtrainer.widgets`` from a directory outside the repo: both must come from the
    new venv. Dependencies are not downloaded: a ``.pth`` file appends the dev venv's site-packages
    *after* the new venv's own, so the new venv's copy of nbtrainer wins and nothing else is needed.
    (Paths listed in a ``.pth`` file are appended to ``sys.path`` but their own ``.pth`` files are not
    run, so the dev venv's editable-install finder stays inactive: the control case checks that.)
(b) The repo's ``widgets/`` imported as a top-level ``widgets`` package raises ImportError.
(c) ``import nbtrainer`` (and the core modules behind its public names) imports none of ipywidgets,
    bqplot, IPython, tqdm.notebook.
(d) The sdist is the package (every module, ``py.typed``, README, pyproject) and ships no tests: they need
    the whole repository and run from a clone. The wheel is built from that sdist, so the sdist builds.
    Both carry the SPDX license expression, with no setuptools deprecation warning about it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from _venvs import clean_env as _clean_env
from _venvs import make_overlay_venv
from _venvs import run as _run

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("ipywidgets", "bqplot", "IPython", "tqdm.notebook")

# Everything the build needs is copied; these are never part of a wheel's inputs (used where git cannot list them).
_COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".vscode-harness",
    "test-artifacts",
    ".ipynb_checkpoints",
    "bench",
    "notebooks",
    "node_modules",
    ".whl",
)


def _copy_sources(dest: Path) -> None:
    """The files a commit of this tree would hold (tracked, and untracked ones .gitignore lets through), as a clone
    has them. Not a copy of the working directory: in CI the colab venv (450 MB) is being built beside this test,
    and copying it made the build the suite's slowest set-up (88 s in a fresh clone)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:  # not a git checkout (an unpacked archive): the directory, less what never ships
        shutil.copytree(REPO, dest, ignore=_COPY_IGNORE)
        return
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not there to copy
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _probe(py: Path, cwd: Path, code: str) -> dict:
    out = _run([str(py), "-c", code], cwd=cwd).stdout.strip().splitlines()
    return json.loads(out[-1])


PROBE = textwrap.dedent(
    """
    import json, sys, importlib.metadata as md
    import nbtrainer, nbtrainer.widgets
    print(json.dumps({
        "nbtrainer": nbtrainer.__file__,
        "widgets": nbtrainer.widgets.__file__,
        "version": md.version("nbtrainer"),
        "prefix": sys.prefix,
        "top_level_widgets": "widgets" in sys.modules,
    }))
    """
)


def _inside(path: str, root: Path) -> bool:
    return Path(path).resolve().is_relative_to(root.resolve())


def _source_files() -> list[str]:
    """Every module as installed: ``nbtrainer/...``, and ``widgets/...`` as ``nbtrainer/widgets/...``."""
    core = [f"nbtrainer/{p.relative_to(REPO / 'nbtrainer').as_posix()}" for p in (REPO / "nbtrainer").rglob("*.py")]
    ui = [f"nbtrainer/widgets/{p.relative_to(REPO / 'widgets').as_posix()}" for p in (REPO / "widgets").rglob("*.py")]
    return core + ui


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The sdist, and the wheel built *from that sdist* (so the sdist is proven complete for building)."""
    tmp = tmp_path_factory.mktemp("dists")
    src = tmp / "src"
    _copy_sources(src)
    dist = tmp / "dist"
    # --no-isolation: build with the dev venv's setuptools (offline); -x: don't check build-system.requires
    # (the dev venv's setuptools satisfies it, but checking needs an index).
    proc = _run([sys.executable, "-m", "build", "--no-isolation", "-x", "--outdir", str(dist), str(src)], cwd=tmp)
    wheels, sdists = sorted(dist.glob("nbtrainer-*.whl")), sorted(dist.glob("nbtrainer-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, (wheels, sdists)
    return {"wheel": wheels[0], "sdist": sdists[0], "log": proc.stdout + proc.stderr}


@pytest.mark.slow
def test_sdist_is_the_package_without_tests(dists: dict[str, Any]) -> None:
    """Decision: the sdist ships no tests (they need the whole repository and run from a clone; MANIFEST.in)."""
    with tarfile.open(dists["sdist"]) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        pkg_info = tar.extractfile(
            next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        )
        assert pkg_info is not None
        metadata = pkg_info.read().decode()
    assert not [n for n in names if n.split("/")[0] in ("tests", "notebooks", "bench", "examples")], names
    in_repo = [f.replace("nbtrainer/widgets/", "widgets/", 1) for f in _source_files()]
    missing = sorted(set(in_repo) - set(names))
    assert not missing, f"modules missing from the sdist: {missing}"
    assert {"README.md", "pyproject.toml", "nbtrainer/py.typed"} <= set(names), names
    assert "License-Expression: Apache-2.0" in metadata, metadata[:800]
    assert "project.license` as a TOML table is deprecated" not in dists["log"], dists["log"][-2000:]


@pytest.mark.slow
def test_wheel_installs_widgets_as_nbtrainer_widgets(dists: dict[str, Any], tmp_path: Path) -> None:
    wheels = [dists["wheel"]]
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "nbtrainer/__init__.py" in names
    assert "nbtrainer/widgets/__init__.py" in names
    assert not [n for n in names if n.startswith("widgets/")], "a top-level widgets/ package leaked into the wheel"
    assert not [n for n in names if n.startswith("tests/")], "tests leaked into the wheel"
    # every source module ships, private subpackages (nbtrainer/_profile/...) included, and the PEP 561 marker
    missing = sorted({*_source_files(), "nbtrainer/py.typed"} - set(names))
    assert not missing, f"modules missing from the wheel (add their package to [tool.setuptools] packages): {missing}"
    metadata = zipfile.ZipFile(wheels[0]).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata, metadata[:800]

    venv = tmp_path / "venv"
    py, _ = make_overlay_venv(venv)
    outside = tmp_path / "elsewhere"
    outside.mkdir()

    # Control: before the install, nbtrainer is NOT importable there (the dev venv's editable finder is
    # inactive through the .pth), so the import below really exercises the wheel.
    ctrl = subprocess.run(
        [str(py), "-c", "import nbtrainer"], cwd=outside, env=_clean_env(), capture_output=True, text=True
    )
    assert ctrl.returncode != 0 and "No module named 'nbtrainer'" in ctrl.stderr, ctrl.stderr

    _run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheels[0])],
        cwd=outside,
    )

    info = _probe(py, outside, PROBE)
    assert _inside(info["widgets"], venv), info
    assert _inside(info["nbtrainer"], venv), info
    assert Path(info["widgets"]).parent.name == "widgets" and Path(info["widgets"]).parent.parent.name == "nbtrainer"
    assert not _inside(info["widgets"], REPO), info
    assert info["version"], info
    assert info["top_level_widgets"] is False, info


def test_top_level_widgets_import_is_refused(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        try:
            import widgets
        except ImportError as exc:
            print("IMPORTERROR:", exc)
        else:
            print("IMPORTED:", widgets.__file__)
        """
    )
    proc = _run([sys.executable, "-c", code], cwd=tmp_path)
    assert "IMPORTERROR:" in proc.stdout, proc.stdout
    assert "nbtrainer.widgets" in proc.stdout, proc.stdout


def _core_modules() -> list[str]:
    """The core modules behind ``nbtrainer``'s public names (the widget layer excluded), as present now."""
    import nbtrainer

    mods = sorted({m for m in nbtrainer._LAZY.values() if m.startswith("nbtrainer._")})
    found = [m for m in mods if _module_file(m).exists()]
    assert "nbtrainer._profile._model" in found, found  # modules inside private subpackages are found too
    return found


def _module_file(module: str) -> Path:
    path = REPO.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


_CHECK = textwrap.dedent(
    """
    import importlib, json, sys
    for name in {mods!r}:
        importlib.import_module(name)
    print(json.dumps(sorted(m for m in {forbidden!r}
                            if m in sys.modules or any(k.startswith(m + ".") for k in sys.modules))))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["package", "core-modules"])
def test_core_import_pulls_no_jupyter(tmp_path: Path, what: str) -> None:
    mods = ["nbtrainer"] if what == "package" else ["nbtrainer", *_core_modules()]
    proc = _run([sys.executable, "-c", _CHECK.format(mods=mods, forbidden=FORBIDDEN)], cwd=tmp_path)
    leaked = json.loads(proc.stdout.strip().splitlines()[-1])
    assert leaked == [], f"importing {mods} imported {leaked}"
