"""The panel's message area: the last few messages in view, every message one click away, a bounded log.

A run that warns every epoch must not grow the panel without end: only ``SHOWN`` lines are displayed;
"show all" opens a scroll box with the whole log (kept up to ``KEEP`` messages).

Every widget of the area is made at construction, on the kernel's thread: a message is new text in a line made then,
never a new widget. Messages arrive from the panel's UI thread mid-run, and a widget made there opens a comm while
ipykernel may be iterating its comms to answer ``comm_info`` (the race tests/widgets/test_widget_comms.py describes);
a widget per message also left up to ``KEEP`` comms open that nothing closed.
"""

from __future__ import annotations

import html
import threading

import ipywidgets as W

from ._layouts import plain_html
from ._markup import text_html
from ._theme import ERROR, FG, WARN

__all__ = ["MessageLog"]

SHOWN = 3
KEEP = 500
_COLORS = {"error": ERROR, "warning": WARN, "info": FG}
_LEVEL_CLASSES = tuple(f"nbt-message-{level}" for level in _COLORS)


def _body(level: str, text: str, details: str | None) -> str:
    color = _COLORS.get(level, FG)
    body = f"<span style='color:{color}'><b>{level}</b>: {text_html(text)}</span>"
    if details:
        body += (
            f"<details class='nbt-traceback' style='color:{FG}'><summary>traceback</summary>"
            f"<pre style='font-size:11px;white-space:pre-wrap;color:{FG}'>{html.escape(details)}</pre></details>"
        )
    return body


def _line(body: str, css: str = "") -> str:
    return f"<div{css} style='font-size:12px;line-height:1.4'>{body}</div>"


class MessageLog:
    """``root`` (class ``nbt-messages``): message lines (``nbt-message-<level>``) and ``nbt-messages-all``.

    ``lines.children`` are the lines in view: the last ``SHOWN`` messages, each an HTML widget with its level's
    class; with "show all" on, one scroll box (``nbt-messages-scroll``) whose ``div.nbt-message-<level>`` are every
    kept message.
    """

    def __init__(self) -> None:
        self._kept: list[tuple[str, str, str]] = []  # (level, text, the message's HTML), the last KEEP
        self._lock = threading.Lock()  # the UI thread and click handlers both add messages
        self._shown = [plain_html() for _ in range(SHOWN)]
        self._all = plain_html()
        self._all.add_class("nbt-messages-scroll")
        self.lines = W.VBox()
        self.lines.add_class("nbt-messages-lines")
        self.show_all = W.ToggleButton(
            value=False, description="show all", layout=W.Layout(width="auto", display="none")
        )
        self.show_all.add_class("nbt-messages-all")
        self.root = W.VBox([self.lines, self.show_all])
        self.root.add_class("nbt-messages")
        self.held: tuple[W.Widget, ...] = (*self._shown, self._all)  # made here, in the tree only when in use
        self.show_all.observe(lambda _: self._locked_render(), "value")

    @property
    def log(self) -> list[tuple[str, str]]:
        """``(level, text)`` of each kept message, oldest first."""
        return [(level, text) for level, text, _ in self._kept]

    def add(self, level: str, text: str, details: str | None = None) -> None:
        body = _body(level, text, details)
        with self._lock:
            self._kept.append((level, text, body))
            del self._kept[:-KEEP]
            self._render()

    def _locked_render(self) -> None:
        with self._lock:
            self._render()

    def _render(self) -> None:
        kept = self._kept
        hidden = len(kept) - SHOWN
        if self.show_all.value:
            self._all.value = "".join(_line(body, f" class='nbt-message-{level}'") for level, _, body in kept)
            self.lines.layout.max_height, self.lines.layout.overflow = "240px", "auto"
            self.lines.children = (self._all,)
            self.show_all.description = "show fewer"
        else:
            last = kept[-SHOWN:]
            for line, (level, _, body) in zip(self._shown, last, strict=False):
                line.value = _line(body)  # an unchanged value sends nothing (traitlets compares)
                for css in _LEVEL_CLASSES:
                    if css != f"nbt-message-{level}":
                        line.remove_class(css)
                line.add_class(f"nbt-message-{level}")
            self.lines.layout.max_height, self.lines.layout.overflow = None, None
            self.lines.children = tuple(self._shown[: len(last)])
            self.show_all.description = f"show all ({len(kept)})"
        self.show_all.layout.display = "flex" if hidden > 0 else "none"
        self.show_all.tooltip = f"{max(hidden, 0)} earlier message(s)"
