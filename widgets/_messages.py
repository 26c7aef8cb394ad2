"""The panel's message area: the last few messages in view, every message one click away, a bounded log.

A run that warns every epoch must not grow the panel without end: only ``SHOWN`` lines are displayed;
"show all" opens a scroll box with the whole log (kept up to ``KEEP`` messages).
"""

from __future__ import annotations

import html
import threading

import ipywidgets as W

from ._markup import text_html
from ._theme import ERROR, FG, WARN

__all__ = ["MessageLog"]

SHOWN = 3
KEEP = 500
_COLORS = {"error": ERROR, "warning": WARN, "info": FG}


class MessageLog:
    """``root`` (class ``nbt-messages``): message lines (``nbt-message-<level>``) and ``nbt-messages-all``."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (level, text): what tests and callers read
        self._items: list[W.HTML] = []
        self._lock = threading.Lock()  # the UI thread and click handlers both add messages
        self.lines = W.VBox()
        self.lines.add_class("nbt-messages-lines")
        self.show_all = W.ToggleButton(
            value=False, description="show all", layout=W.Layout(width="auto", display="none")
        )
        self.show_all.add_class("nbt-messages-all")
        self.root = W.VBox([self.lines, self.show_all])
        self.root.add_class("nbt-messages")
        self.show_all.observe(lambda _: self._render(), "value")

    def add(self, level: str, text: str, details: str | None = None) -> None:
        color = _COLORS.get(level, FG)
        body = f"<span style='color:{color}'><b>{level}</b>: {text_html(text)}</span>"
        if details:
            body += (
                f"<details class='nbt-traceback' style='color:{FG}'><summary>traceback</summary>"
                f"<pre style='font-size:11px;white-space:pre-wrap;color:{FG}'>{html.escape(details)}</pre></details>"
            )
        item = W.HTML(f"<div style='font-size:12px;line-height:1.4'>{body}</div>")
        item.add_class(f"nbt-message-{level}")
        with self._lock:
            self.log.append((level, text))
            self._items.append(item)
            del self.log[:-KEEP], self._items[:-KEEP]
            self._render()

    def _render(self) -> None:
        items = self._items
        hidden = len(items) - SHOWN
        if self.show_all.value:
            self.lines.layout.max_height, self.lines.layout.overflow = "240px", "auto"
            self.lines.children = tuple(items)
            self.show_all.description = "show fewer"
        else:
            self.lines.layout.max_height, self.lines.layout.overflow = None, None
            self.lines.children = tuple(items[-SHOWN:])
            self.show_all.description = f"show all ({len(items)})"
        self.show_all.layout.display = "flex" if hidden > 0 else "none"
        self.show_all.tooltip = f"{max(hidden, 0)} earlier message(s)"
