"""Flow control between the panel's UI thread and the page that draws it.

A page that draws slower than the kernel sends (a loaded machine, a slow laptop, a renderer without a GPU) queues
the widget messages in order, so a click's answer waits behind every chart update sent before it. With Chromium's
renderer slowed 6x (``Emulation.setCPUThrottlingRate``), the classic Notebook's panel still showed "running" at step
128, 3.8 s into the run, after its Pause had been clicked and the test's processes had spent 20 CPU seconds: the
page drew a past the kernel had long left. Budgets in points a second (``_pump``) bound what is sent, not what a
page can draw.

So the page says how far it has got. After each push the pump sets ``ping`` to the push's number; a ``jsdlink`` in
the page copies it to ``pong`` once the page has applied every message sent before it (each model's updates run in
arrival order), and ``pong``'s change comes back to the kernel. The pump sends a push only while fewer than
``MAX_IN_FLIGHT`` are unanswered, so a page is never more than that behind, however slow it draws; what arrives
meanwhile goes in the next push (the charts keep every point). Where no page has ever answered (none shows the
panel, a front end without links, a headless run), nothing waits. Where the answers stop for ``stale_s`` seconds,
the pushes go as before until the next answer: the page was closed, or the kernel does not read the page's messages
now (another cell runs while the panel trains in the background; VS Code on ipykernel 6 while ``w.fit()`` blocks),
and a panel must not stop moving for that. The run's final push always goes.

Example:
    >>> flow = PageFlow()
    >>> flow.ready()  # no page has answered yet: push
    True
    >>> flow.sent(); flow.sent()
    >>> flow.pong.value = 0  # what a page's link does once it has drawn push 0
    >>> flow.ready()  # pushes 1 and 2 are unanswered
    False
    >>> flow.pong.value = 2
    >>> flow.ready()
    True
    >>> flow.close()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from ._lifecycle import close_widgets

__all__ = ["MAX_IN_FLIGHT", "STALE_S", "PageFlow"]

MAX_IN_FLIGHT = 1  # pushes a page may have unanswered (a push is a few messages: the status among them)
STALE_S = 3.0  # no answer for this long: the page is gone, or the kernel does not read its messages now (the default)


class PageFlow:
    """The numbered pushes and the page's answers. ``on_answer`` runs on the thread that reads the page's messages
    (it wakes the pump); ``stale_s``: how long without an answer before the pushes go ungated."""

    def __init__(self, on_answer: Callable[[], Any] | None = None, *, stale_s: float = STALE_S) -> None:
        hidden = W.Layout(display="none")
        self.ping = W.IntText(value=0, layout=hidden)
        self.pong = W.IntText(value=-1, layout=hidden)  # the page's first sync (0) is its first answer
        self.link = W.jsdlink((self.ping, "value"), (self.pong, "value"))
        self.pushes = 0  # numbered from 1; ping 0 is the links' own first sync
        self.answered: int | None = None  # the newest push a page has answered (None: no page ever has)
        self._on_answer = on_answer
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._last = time.monotonic()  # the last answer
        self.pong.observe(self._answer, "value")

    def _answer(self, change: dict[str, Any]) -> None:
        value = change["new"]  # an IntText's: an int, and never below ping's first value (0)
        with self._lock:
            self.answered = value if self.answered is None else max(self.answered, value)
            self._last = time.monotonic()
        if self._on_answer is not None:
            self._on_answer()

    def ready(self) -> bool:
        """May the next push go now?"""
        with self._lock:
            if self.answered is None or self.pushes - self.answered < MAX_IN_FLIGHT:
                return True
            return time.monotonic() - self._last >= self.stale_s

    def sent(self) -> None:
        """A push has just been sent: number it (one small message, after the push's own)."""
        with self._lock:
            self.pushes += 1
            n = self.pushes
        self.ping.value = n

    def close(self) -> None:
        close_widgets(self.link, self.ping, self.pong)  # their layout and styles too: each is a comm of its own
