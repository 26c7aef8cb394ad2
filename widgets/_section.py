"""A titled area of the panel that can be collapsed and closed (profile card, LR finder, epoch table, summary).

The panel must stay bounded: each side area starts hidden, shows when it has content, folds to its title
line with one click and disappears with another.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from ._layouts import plain_html, shared_layout, shared_style
from ._markup import text_html
from ._theme import FG

__all__ = ["Section"]


class Section:
    """``root`` is a VBox (class ``css``): a header (title, collapse toggle, optional close button) and a body."""

    def __init__(self, title: str, css: str, *, closable: bool = True) -> None:
        self._title = title
        self.title = plain_html(flex="0 1 auto", min_width="0")
        self.title.add_class("nbt-section-title")
        icon = {"layout": shared_layout(width="32px", height="24px"), "style": shared_style(W.Button)}  # _layouts
        self.toggle = W.Button(icon="chevron-up", tooltip="collapse", **icon)
        self.toggle.add_class("nbt-collapse")
        # only where the area can close: a button never shown would be a widget (a comm) the panel never closes
        self.close_button: W.Button | None = None
        if closable:
            self.close_button = W.Button(icon="times", tooltip="close", **icon)
            self.close_button.add_class("nbt-close")
            self.close_button.on_click(lambda _: self.close())
        buttons = [self.toggle, *([self.close_button] if self.close_button is not None else [])]
        self.header = W.HBox([self.title, *buttons], layout=shared_layout(align_items="center"))
        self.body = W.VBox()
        self.root = W.VBox([self.header, self.body], layout=W.Layout(display="none", margin="4px 0"))
        self.root.add_class(css)
        self.root.add_class("nbt-section")
        self.toggle.on_click(lambda _: self.set_open(not self.is_open))
        self.set_title(title)

    @property
    def is_open(self) -> bool:
        return self.body.layout.display != "none"

    @property
    def visible(self) -> bool:
        return self.root.layout.display != "none"

    def set_title(self, title: str, detail: str = "") -> None:
        self._title = title
        tail = f" <span style='font-weight:normal'>{text_html(detail)}</span>" if detail else ""
        # One line ("5 epoch(s)" never splits in a narrow panel); too long for the width, it ends in "...".
        self.title.value = (
            f"<div style='white-space:nowrap;overflow:hidden;text-overflow:ellipsis;color:{FG};font-size:12px'>"
            f"<b>{html.escape(title)}</b>{tail}</div>"
        )

    def show(self, *children: Any, detail: str = "", is_open: bool = True) -> None:
        """Show the area (open, or folded to its title line), then put ``children`` in the body.

        In that order: a chart drawn inside a hidden area measures 0 x 0 (bqplot logs "negative width" and the
        plot stayed invisible)."""
        if detail:
            self.set_title(self._title, detail)
        self.set_open(is_open)
        self.root.layout.display = "flex"
        self.body.children = tuple(children)

    def set_open(self, is_open: bool) -> None:
        self.body.layout.display = "flex" if is_open else "none"
        self.toggle.icon = "chevron-up" if is_open else "chevron-down"
        self.toggle.tooltip = "collapse" if is_open else "expand"

    def close(self) -> None:
        """Hide the area and drop its content (a later ``show`` brings it back)."""
        self.body.children = ()
        self.root.layout.display = "none"
