"""The panel's theme as a stylesheet, and the few widget calls that differ between ipywidgets 7 and 8.

Widget traits never hold a CSS variable: ipywidgets 7.7 (Google Colab's) validates colour traits
(``Axis.label_color``, a Label mark's ``colors``) as HTML colours and raised a TraitError on
``var(--jp-ui-font-color1, ...)``. The theme's colours reach the charts through :data:`THEME_CSS` instead:
rules on bqplot's own SVG classes (``text.axislabel``, ``text.mainheading``, a Label mark's ``text.label``)
inside any figure that carries an ``nbt-`` class, and on the panel's ``nbt-`` classes. ``!important``
because bqplot writes some fills as inline styles. The variables keep a fallback for front ends without
JupyterLab's (classic Notebook 6.5, Colab, VS Code): dark text on their light output area.

A ``<style>`` in an HTML widget applies to the whole page; each root that can be displayed on its own
carries one (:func:`theme_style`), because Colab draws every output in its own frame.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as W

from ._theme import BORDER, FG

__all__ = ["IPYWIDGETS_MAJOR", "THEME_CSS", "set_tooltip", "theme_style"]

IPYWIDGETS_MAJOR = int(W.__version__.split(".", 1)[0])

# bqplot figures of this package: each has an nbt- class (nbt-chart-loss, nbt-lrfinder-chart, nbt-runs-chart...)
_FIG = '.bqplot[class*="nbt-"] > svg'
THEME_CSS = (
    f"{_FIG} .axis text.axislabel,{_FIG} .axis tspan.axislabel{{fill:{FG}!important}}"
    f"{_FIG} text.mainheading{{fill:{FG}!important;font-size:13px;font-weight:600}}"
    f"{_FIG} g.object_grp text.label{{fill:{FG}!important}}"
    f".nbt-panel{{border:1px solid {BORDER}}}"
    # Outside JupyterLab / Notebook 7 (no data-jp-theme-light on the body) and VS Code (vscode-* body classes), the
    # --jp-* variables are ipywidgets 7's own defaults (classic Notebook, Colab), whose secondary text colour,
    # rgba(0,0,0,.5), is 3.95:1 on white, under WCAG AA: nbt- views take a grey that reads 6:1 there.
    'body:not([data-jp-theme-light]):not([class*="vscode"]) [class*="nbt-"]{--jp-ui-font-color2:#59636e}'
    # Start and Stop: white on their own green and red (ButtonStyle.text_color is ipywidgets 8 only)
    ".jupyter-button.nbt-start,.jupyter-button.nbt-stop{color:#fff!important}"
    # bqplot's tooltip box stays where it was shown until the pointer moves over a point again: it covered the next
    # confusion-matrix cell (or loss point) clicked and took the click (bqplot 0.12: .tooltip_div in the figure;
    # 0.13: .bqplot_tooltip_div on the page's body, and a mark's own box may be set to take the pointer). A tooltip
    # only shows: the pointer goes through it. (Mark.tooltip_style styles its content, not these boxes.)
    ".tooltip_div,.bqplot_tooltip_div,.mark_tooltip,.bqplot_mark_tooltip{pointer-events:none!important}"
)


def theme_style() -> W.HTML:
    """A zero-height HTML widget holding :data:`THEME_CSS` (put it among a root's children)."""
    style = W.HTML(f"<style>{THEME_CSS}</style>", layout=W.Layout(height="0px", margin="0px"))
    style.add_class("nbt-style")
    return style


def set_tooltip(widget: Any, text: str) -> None:
    """A widget's hover text: ``tooltip`` where the widget has that trait (every widget on ipywidgets 8, a
    Button on 7), else ``description_tooltip`` (ipywidgets 7; 8 deprecates it). A plain attribute set on a
    widget without the trait would be silently lost."""
    if widget.has_trait("tooltip"):
        widget.tooltip = text
    elif widget.has_trait("description_tooltip"):
        widget.description_tooltip = text
