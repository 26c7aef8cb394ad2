"""Throwaway virtual environments for the packaging and Binder tests.

An *overlay* venv is fresh (no pip of its own, no access to the repository) but its ``sys.path`` ends with
the dev venv's site-packages through a ``.pth`` file: installing the project into it takes seconds and needs
no network, while every import of the project itself must come from what was installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path


def clean_env() -> dict[str, str]:
    """The environment for child interpreters: no PYTHONPATH/PYTHONHOME leaking in from the runner."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run ``cmd``; on failure raise with the tail of its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


def make_overlay_venv(path: Path) -> tuple[Path, Path]:
    """Create the overlay venv at ``path``; returns its python and its site-packages folder.

    Install into it with ``python -m pip --python <its python> ...``.
    """
    run([sys.executable, "-m", "venv", "--without-pip", str(path)], cwd=path.parent)
    py = path / "bin" / "python"
    site = Path(
        run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=path.parent
        ).stdout.strip()
    )
    paths = sysconfig.get_paths()
    dev = dict.fromkeys([paths["purelib"], paths["platlib"]])
    (site / "zz_nbtrainer_dev_site.pth").write_text("\n".join(dev) + "\n")
    return py, site
