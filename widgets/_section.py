"""A titled area of the panel that can be collapsed and closed (profile card, LR finder, epoch table, summary).

The panel must stay bounded: each side area starts hidden, shows when it has content, folds to its title
line with one click and disappears with another.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from ._markup import text_html
from ._theme import FG

__all__ = ["Section"]


class Section:
    """``root`` is a VBox (class ``css``): a header (title, collapse toggle, optional close button) and a body.

    The header's widgets (eleven, with their layouts and styles) are made when the area first shows, or when one of
    them is asked for (:attr:`title`, :attr:`toggle`, :attr:`close_button`, :attr:`header`): most of a panel's areas
    stay hidden through a run, and each widget is a comm that the kernel opens and the front end builds a model for
    when the panel is displayed.
    """

    def __init__(self, title: str, css: str, *, closable: bool = True) -> None:
        self._title, self._detail, self._closable = title, "", closable
        self._chrome: tuple[W.HTML, W.Button, W.Button, W.HBox] | None = None
        self.body = W.VBox()
        self.root = W.VBox([self.body], layout=W.Layout(display="none", margin="4px 0"))
        self.root.add_class(css)
        self.root.add_class("nbt-section")

    def _header(self) -> tuple[W.HTML, W.Button, W.Button, W.HBox]:
        if self._chrome is None:
            title = W.HTML(layout=W.Layout(flex="0 1 auto", min_width="0"))
            title.add_class("nbt-section-title")
            toggle = W.Button(icon="chevron-up", tooltip="collapse", layout=W.Layout(width="32px", height="24px"))
            toggle.add_class("nbt-collapse")
            close = W.Button(icon="times", tooltip="close", layout=W.Layout(width="32px", height="24px"))
            close.add_class("nbt-close")
            buttons = [toggle, *([close] if self._closable else [])]
            header = W.HBox([title, *buttons], layout=W.Layout(align_items="center"))
            toggle.on_click(lambda _: self.set_open(not self.is_open))
            close.on_click(lambda _: self.close())
            self._chrome = (title, toggle, close, header)
            self._draw_title()
            self._draw_toggle()
            self.root.children = (header, self.body)
        return self._chrome

    @property
    def title(self) -> W.HTML:
        return self._header()[0]

    @property
    def toggle(self) -> W.Button:
        return self._header()[1]

    @property
    def close_button(self) -> W.Button:
        return self._header()[2]

    @property
    def header(self) -> W.HBox:
        return self._header()[3]

    @property
    def is_open(self) -> bool:
        return self.body.layout.display != "none"

    @property
    def visible(self) -> bool:
        return self.root.layout.display != "none"

    def set_title(self, title: str, detail: str = "") -> None:
        self._title, self._detail = title, detail
        if self._chrome is not None:
            self._draw_title()

    def _draw_title(self) -> None:
        assert self._chrome is not None
        detail = self._detail
        tail = f" <span style='font-weight:normal'>{text_html(detail)}</span>" if detail else ""
        # One line ("5 epoch(s)" never splits in a narrow panel); too long for the width, it ends in "...".
        self._chrome[0].value = (
            f"<div style='white-space:nowrap;overflow:hidden;text-overflow:ellipsis;color:{FG};font-size:12px'>"
            f"<b>{html.escape(self._title)}</b>{tail}</div>"
        )

    def _draw_toggle(self) -> None:
        assert self._chrome is not None
        toggle, is_open = self._chrome[1], self.is_open
        toggle.icon = "chevron-up" if is_open else "chevron-down"
        toggle.tooltip = "collapse" if is_open else "expand"

    def show(self, *children: Any, detail: str = "", is_open: bool = True) -> None:
        """Show the area (open, or folded to its title line), then put ``children`` in the body.

        In that order: a chart drawn inside a hidden area measures 0 x 0 (bqplot logs "negative width" and the
        plot stayed invisible)."""
        if detail:
            self.set_title(self._title, detail)
        self._header()
        self.set_open(is_open)
        self.root.layout.display = "flex"
        self.body.children = tuple(children)

    def set_open(self, is_open: bool) -> None:
        self.body.layout.display = "flex" if is_open else "none"
        if self._chrome is not None:
            self._draw_toggle()

    def close(self) -> None:
        """Hide the area and drop its content (a later ``show`` brings it back)."""
        self.body.children = ()
        self.root.layout.display = "none"
