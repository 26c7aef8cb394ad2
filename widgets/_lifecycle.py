"""The end of a run and of a panel: waiting for a run from a cell (:func:`wait_run`), and closing a panel
(:func:`close_widgets`, :func:`on_close`).

A panel whose widgets are closed (``w.close()``, ``w.panel.close()``, ``Widget.close_all()``) has no Pause or Stop
left to click, so a run it started must not go on training behind it: the panel watches its root's comm and, when
it goes, stops the run and waits for its training thread (``TrainerWidget.close``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from . import _frontends
from ._layouts import Shared
from ._poll import wait_until
from ._runner import Run

__all__ = ["close_widgets", "end_run", "on_close", "replace_children", "say_foreground", "wait_run"]


def wait_run(run: Run, *, label: str, view: Any, timeout: float | None) -> None:
    """Block until ``run`` ends (``TimeoutError`` after ``timeout`` s). From a notebook cell, clicks on Pause, Stop or
    the LR keep working meanwhile (``_poll``); interrupting the cell stops the run and the kernel lives on."""
    deadline = None if timeout is None else time.monotonic() + timeout

    def done(wait_s: float) -> bool:
        if run.join(wait_s):
            return True
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{label} still running after {timeout} s")
        return False

    try:
        with view.noting(_frontends.unreachable_clicks()):  # where clicks cannot come, what works instead
            wait_until(done)
    except KeyboardInterrupt:
        run.stop("interrupted (KeyboardInterrupt)")
        run.join()


def say_foreground(model: Any) -> None:
    """``fit()`` without a notebook front end: the panel cannot show, so the run trains in the foreground."""
    print(
        f"nbtrainer: no notebook front end here, so {type(model).__name__} trains in the foreground with console "
        "progress.",
        file=sys.stderr,
        flush=True,
    )


def end_run(run: Run | None, pump: Any, reason: str) -> None:
    """Stop ``run`` if it trains and wait for its training thread, then for the UI thread's last push and summary
    (before their widgets are closed)."""
    if run is not None and run.alive:
        run.stop(reason)
        run.join()
    if pump is not None:
        pump.join()


def on_close(widget: W.Widget, callback: Callable[[], Any]) -> None:
    """Call ``callback`` once ``widget`` is closed. ipywidgets 7 and 8 both end ``Widget.close()`` (which
    ``Widget.close_all()`` calls too) by setting the ``comm`` trait to None, and have no hook of their own."""

    def closed(change: dict[str, Any]) -> None:
        if change.get("new") is None:
            callback()

    widget.observe(closed, "comm")


def close_widgets(*roots: W.Widget) -> int:
    """Close ``roots`` and every widget they hold (children, a figure's marks, axes and scales, layouts and styles)
    but a panel's shared layouts, which other widgets of it may show (the panel passes them as roots when it closes,
    ``_layouts``); returns how many were open. A closed widget's comm is gone, so each is closed once."""
    seen: set[int] = set()
    stack, closed = list(roots), 0
    while stack:
        widget = stack.pop()
        if id(widget) in seen:
            continue
        seen.add(id(widget))
        for name in widget.keys:  # the synced traits: where a widget refers to the widgets it shows
            value = getattr(widget, name, None)
            if isinstance(value, dict):
                value = list(value.values())
            values = value if isinstance(value, (list, tuple)) else [value]
            stack += [v for v in values if isinstance(v, W.Widget) and not isinstance(v, Shared)]
        if widget.comm is not None:
            closed += 1
            widget.close()
    return closed


def replace_children(box: W.Box, children: tuple[W.Widget, ...]) -> None:
    """``box`` shows ``children`` instead of what it showed, and what it showed is closed: for rows made anew at each
    drawing (a selection's cleaner rows, a plan's rows), which left open would each be a comm for the kernel's life."""
    old, box.children = box.children, children
    close_widgets(*old)
