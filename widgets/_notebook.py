"""Is there a notebook front end to draw the panel in? Decided at call time, never by importing IPython."""

from __future__ import annotations

import logging
import sys

# The detection (and its NBTRAINER_FRONTEND override) is the core's, so bars and panel always agree.
from nbtrainer import in_notebook

__all__ = ["cell_id", "in_notebook"]

log = logging.getLogger(__name__)


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
    except Exception:
        log.debug("the running cell could not be found: no cell id", exc_info=True)
        return None
