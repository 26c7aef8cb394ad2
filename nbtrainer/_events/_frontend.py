"""Notebook or console? Decided at run time without importing IPython."""

from __future__ import annotations

import os
import sys

__all__ = ["in_notebook"]

#: ``NBTRAINER_FRONTEND=console`` / ``notebook`` overrides the detection (scripts run through a kernel, CI).
ENV = "NBTRAINER_FRONTEND"


def in_notebook() -> bool:
    """True inside a Jupyter kernel (ZMQ shell: JupyterLab, Notebook, Voila, nbclient).

    False in plain Python, the IPython terminal and scripts. The environment variable
    ``NBTRAINER_FRONTEND=console`` (or ``notebook``) overrides the detection; progress bars and the
    widget panel both follow it.

    Example:
        >>> from nbtrainer import in_notebook
        >>> in_notebook()
        False
    """
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("console", "script", "headless"):
        return False
    if forced in ("notebook", "jupyter", "widget"):
        return True
    ipython_mod = sys.modules.get("IPython")  # only if someone imported it: never imported from here
    if ipython_mod is None:
        return False
    get_ipython = getattr(ipython_mod, "get_ipython", None)
    shell = get_ipython() if get_ipython else None
    cls = type(shell)  # ipykernel's shell, told without importing ipykernel
    return shell is not None and cls.__module__.startswith("ipykernel") and cls.__name__ == "ZMQInteractiveShell"
