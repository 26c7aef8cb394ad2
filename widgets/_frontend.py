"""Is there a notebook front end to draw the panel in? Decided at call time, never by importing IPython."""

from __future__ import annotations

import os
import sys

__all__ = ["cell_id", "in_notebook"]

#: ``NBTRAINER_FRONTEND=console`` / ``notebook`` overrides the detection (scripts run through a kernel, CI).
ENV = "NBTRAINER_FRONTEND"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ZMQ shell: JupyterLab, Notebook, Voila, nbclient)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("console", "script", "headless"):
        return False
    if forced in ("notebook", "jupyter", "widget"):
        return True
    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:
        return False
    get_ipython = getattr(ipython_mod, "get_ipython", None)
    shell = get_ipython() if get_ipython else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def cell_id() -> tuple[str, str] | None:
    """``(cell id, execution message id)`` of the notebook cell executing now, else None.

    JupyterLab and Notebook 7 send the cell id with each execution; re-running a cell gives the same
    cell id with a new message id.
    """
    try:
        shell = sys.modules["IPython"].get_ipython()
        kernel = getattr(shell, "kernel", None)
        parent = (kernel.get_parent("shell") if kernel is not None else None) or {}
        cell = (parent.get("metadata") or {}).get("cellId")
        return (str(cell), str((parent.get("header") or {}).get("msg_id"))) if cell else None
    except Exception:  # noqa: BLE001 - no IPython, no kernel, an old kernel: no cell id
        return None
