"""Notebook or console? Decided at run time without importing IPython."""

from __future__ import annotations

import sys

__all__ = ["in_notebook"]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ZMQ shell); False in plain Python, IPython terminal, scripts."""
    ipython_mod = sys.modules.get("IPython")
    if ipython_mod is None:
        return False
    get_ipython = getattr(ipython_mod, "get_ipython", None)
    shell = get_ipython() if get_ipython else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
