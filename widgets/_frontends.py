"""Which front end draws the panel, and what it can take: Google Colab, VS Code, or any other Jupyter front end.

Detected at call time, from what each front end leaves in the kernel (never by importing IPython):

- **Colab**: ``google.colab`` is importable. Third-party widgets (bqplot) draw only once
  ``google.colab.output.enable_custom_widget_manager()`` has run, and only in outputs displayed after it:
  :func:`prepare_display` calls it, once per kernel, before the first display of any nbtrainer view.
- **VS Code**: ``VSCODE_PID`` in the kernel's environment (the Jupyter extension starts kernels with it).
  Every widget message is relayed through the extension host, which waits for the webview's acknowledgement.

Both get fewer, larger updates (:class:`FrontEnd`: at least 0.5 s between two pushes, as Hugging Face's
notebook callback does under VS Code, and half the chart budgets: Lightning throttled Colab after fast
updates crashed browsers). ``NBTRAINER_WIDGET_FRONTEND=colab|vscode|jupyter`` overrides the detection.

Clicks while a cell blocks in ``w.fit()``: on ipykernel 7 nbtrainer routes them to a kernel subshell
(``_poll``), whatever the front end. On older kernels ``jupyter-ui-poll`` has to process them from inside the
cell, and that fails in VS Code (vscode-jupyter#17360); without it nothing does. There
:func:`unreachable_clicks` says so, and the panel's status line names what works instead.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["FrontEnd", "detect", "prepare_display", "unreachable_clicks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrontEnd:
    """What the panel does differently for one front end.

    Args:
        name: ``"colab"``, ``"vscode"`` or ``"jupyter"`` (JupyterLab, Notebook 6.5 / 7, Voila...).
        min_ui_interval: the fewest seconds between two pushes of the UI thread (``ui_interval`` is raised to it).
        budget: the share of the charts' and the epoch table's budgets (points and cells per second).

    Example:
        >>> FrontEnd("jupyter").ui_interval(0.25), FrontEnd("vscode", 0.5, 0.5).ui_interval(0.25)
        (0.25, 0.5)
    """

    name: str
    min_ui_interval: float = 0.05
    budget: float = 1.0

    def ui_interval(self, asked: float) -> float:
        """The UI thread's interval for ``asked`` seconds here."""
        return max(self.min_ui_interval, float(asked))


_PROFILES = {
    "colab": FrontEnd("colab", 0.5, 0.5),
    "vscode": FrontEnd("vscode", 0.5, 0.5),
    "jupyter": FrontEnd("jupyter"),
}
_enabled: set[int] = set()  # id(shell) where the Colab custom widget manager was enabled


def _colab() -> bool:
    return "google.colab" in sys.modules or _has("google.colab")


def detect() -> FrontEnd:
    """The front end of this kernel (``NBTRAINER_WIDGET_FRONTEND`` first, then Colab, then VS Code)."""
    forced = os.environ.get("NBTRAINER_WIDGET_FRONTEND", "").strip().lower()
    if forced in _PROFILES:
        return _PROFILES[forced]
    if _colab():
        return _PROFILES["colab"]
    if os.environ.get("VSCODE_PID"):
        return _PROFILES["vscode"]
    return _PROFILES["jupyter"]


def prepare_display() -> None:
    """Before a view is displayed: on Colab, turn on the custom widget manager (once per kernel)."""
    if not _colab():
        return
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    if id(shell) in _enabled:
        return
    _enabled.add(id(shell))
    try:
        importlib.import_module("google.colab.output").enable_custom_widget_manager()
    except Exception as exc:  # the fallback text and HTML still show; say why the charts may not
        log.debug("Colab's custom widget manager could not be enabled: printed", exc_info=True)
        print(f"nbtrainer: could not enable Colab's custom widget manager ({exc}): charts may not draw.")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing, or a None placed in sys.modules to block it
        return False


def _kernel() -> Any:
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return getattr(shell, "kernel", None)


def unreachable_clicks() -> str:
    """Why the panel's clicks cannot reach this kernel while a cell blocks in it, and what works instead
    ("" where they reach it)."""
    kernel = _kernel()
    if kernel is None or getattr(kernel, "_supports_kernel_subshells", False):
        return ""  # no kernel (nothing to click), or subshells: _poll routes the clicks
    if detect().name == "vscode":
        why = "VS Code cannot deliver clicks to a busy ipykernel 6"
    elif not _has("jupyter_ui_poll"):
        why = "clicks wait for this cell (ipykernel 6 without jupyter-ui-poll)"
    else:
        return ""
    return (
        f"{why}: interrupt the kernel to stop (Ctrl-C or ■; ModelCheckpoint(save_last=True) saves), "
        "or use Start (trains in the background)"
    )
