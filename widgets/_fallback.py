"""What a view shows where widgets cannot render: ``text/plain`` and ``text/html`` beside the widget view.

A front end picks the richest mime type it can draw. JupyterLab, Notebook, Voila, VS Code and Colab (custom
widget manager on) draw the widget; a terminal IPython shows ``text/plain``; GitHub, nbviewer, an export
without JavaScript, marimo or Colab before custom widgets are on show ``text/html``. Neither is ever a
widget's repr ("VBox(children=...)") or an error: status, progress, the last metrics and, once there are
some, the run's charts as static SVG (``History.to_svg``).

The same bundle on ipywidgets 7 and 8: ipywidgets 7 widgets have no ``_repr_mimebundle_`` (they display
themselves through ``_ipython_display_``), so the widget-view entry is built here from the model id, as
both majors do.
"""

from __future__ import annotations

import html
import logging
import re
from typing import Any

from nbtrainer import format_number

from ._frontends import prepare_display

__all__ = ["WidgetView", "html_view", "panel_view"]

log = logging.getLogger(__name__)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class WidgetView:
    """A widget's view with a readable fallback: what ``display()`` publishes for an nbtrainer view.

    Args:
        widget: the root widget drawn where widgets render.
        plain: the ``text/plain`` fallback (readable text, not a repr).
        html_text: the ``text/html`` fallback.

    Example:
        >>> import ipywidgets as W
        >>> sorted(WidgetView(W.HTML("hi"), "hi", "<b>hi</b>")._repr_mimebundle_())
        ['application/vnd.jupyter.widget-view+json', 'text/html', 'text/plain']
    """

    def __init__(self, widget: Any, plain: str, html_text: str) -> None:
        self.widget, self.plain, self.html = widget, plain, html_text

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        prepare_display()  # Colab: the custom widget manager, before anything is published
        view = {"version_major": 2, "version_minor": 0, "model_id": self.widget.model_id}
        return {WIDGET_VIEW: view, "text/plain": self.plain, "text/html": self.html}

    def _ipython_display_(self) -> None:
        from IPython.display import display

        # (ipywidgets 7's own display also fired on_displayed callbacks, which only interact() uses)
        display(self._repr_mimebundle_(), raw=True)


def panel_view(w: Any, *, charts: bool = True) -> WidgetView:
    """``TrainerWidget`` ``w``'s panel with its fallback: name, model, device, status, epochs, the last epoch's
    metrics and (``charts``, once an epoch has ended) the run's SVG charts."""
    h = w.history
    epochs = list(getattr(h, "epochs", []) or [])
    steps = len((getattr(h, "steps", None) or {}).get("step", []))
    model = type(w.trainer.model).__name__
    head = f"TrainerWidget '{w.name}' · {model} on {w.trainer.device}"
    state = f"{w.status} · epoch {len(epochs)}/{w.epochs}" + (f" · {format_number(steps)} steps" if steps else "")
    last = ", ".join(f"{k}={format_number(v)}" for k, v in (epochs[-1] if epochs else {}).items() if k != "epoch")
    note = "a live training panel: it draws where Jupyter widgets render (JupyterLab, Notebook, Voila, VS Code, Colab)"
    plain = "\n".join([head, state, *([last] if last else []), f"({note})"])
    svg = ""
    if charts and epochs:
        try:
            svg = h.to_svg()
        except Exception:  # the fallback must never fail the display
            log.debug("the History's chart could not be drawn: the fallback shows without it", exc_info=True)
            svg = ""
    body = (
        f"<div class='nbt-fallback'><div><b>{html.escape(head)}</b></div>"
        f"<div class='nbt-fallback-status'>{html.escape(state)}</div>"
        + (f"<div class='nbt-fallback-metrics'>{html.escape(last)}</div>" if last else "")
        + (f"<div class='nbt-fallback-charts'>{svg}</div>" if svg else "")
        + f"<div style='font-size:11px;opacity:0.8'>{html.escape(note)}</div></div>"
    )
    return WidgetView(w.panel, plain, body)


def _text(markup: str) -> str:
    """Readable text of an HTML fragment: a line per row, cell or block, tags dropped."""
    text = re.sub(r"<(br|/tr|/div|/p|/h\d|/li|/summary)\b[^>]*>", "\n", markup, flags=re.I)
    text = re.sub(r"</t[dh]>", "  ", re.sub(r"<(style|script)\b.*?</\1>", "", text, flags=re.I | re.S), flags=re.I)
    lines = (" ".join(html.unescape(re.sub(r"<[^>]+>", " ", line)).split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def html_view(root: Any, title: str, *parts: Any) -> WidgetView:
    """``root`` with a fallback made of the current HTML of its ``parts`` (HTML widgets: a status, a table)."""
    body = "".join(str(p.value) for p in parts)
    plain = "\n".join(x for x in (title, _text(body)) if x)
    return WidgetView(root, plain, f"<div class='nbt-fallback'><div><b>{html.escape(title)}</b></div>{body}</div>")
