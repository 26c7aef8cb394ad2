"""Another revision of this repository, checked out beside the working tree, for the benchmarks that compare two
(``overhead_revisions.py``, ``first_panel.py``). No torch here: their parent processes only start the rounds."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def worktree(rev: str, where: Path) -> Iterator[Path]:
    """``rev`` checked out at ``where`` (a detached ``git worktree``), removed again on the way out."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False)
