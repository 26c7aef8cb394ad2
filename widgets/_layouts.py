"""One ``Layout`` for each setting a panel uses, shared by every widget of that panel that never changes its own.

Every ipywidgets widget has a ``Layout``, and each is a widget of its own: about 36 traits sent in a comm-open
message, 0.19 ms to build here and a model in the page for as long as the panel lives. A panel made 171 of them,
36% of its build time, though they held only 40 different settings. A layout can be shared: the front end draws
each widget from the layout model it names (ipywidgets 7 and 8 alike).

A shared layout must never change, or every widget sharing it would change with it (a ``display = "none"`` would
hide them all): :class:`SharedLayout` refuses any change. A widget whose layout changes (shown and hidden, resized)
keeps a ``W.Layout`` of its own.

The sharing is per panel, never across panels: :func:`layout_scope` collects the layouts made while a panel is
built, the panel closes them with itself (:func:`close_widgets` leaves them to it, since the widgets a redraw
replaces may share them with widgets that stay). Outside a scope (rows made at a click or by the UI thread),
:func:`shared_layout` makes a plain ``W.Layout``, closed with its widget as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import ipywidgets as W

__all__ = ["SharedLayout", "layout_scope", "shared_layout"]

_SCOPE: contextvars.ContextVar[dict[tuple[tuple[str, str], ...], SharedLayout] | None] = contextvars.ContextVar(
    "nbtrainer_layout_scope", default=None
)


class SharedLayout(W.Layout):
    """A ``Layout`` that several widgets show and nobody changes (an attempt raises, naming the fix)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False) and name in self.keys:
            raise AttributeError(
                f"this Layout is shared by several of the panel's widgets, so setting {name!r} would change them "
                "all: give the widget that changes its own W.Layout(...) instead of shared_layout(...)"
            )
        super().__setattr__(name, value)


@contextlib.contextmanager
def layout_scope() -> Iterator[dict[tuple[tuple[str, str], ...], SharedLayout]]:
    """While a panel is built: :func:`shared_layout` hands out one layout per setting, kept in the dict yielded
    (the panel closes them when it closes)."""
    made: dict[tuple[tuple[str, str], ...], SharedLayout] = {}
    token = _SCOPE.set(made)
    try:
        yield made
    finally:
        _SCOPE.reset(token)


def shared_layout(**settings: str) -> W.Layout:
    """The current panel's layout for ``settings`` (one per distinct setting), or a new ``W.Layout`` outside a panel's
    construction. For widgets that never change their layout.

    Example:
        >>> with layout_scope() as made:
        ...     a, b = shared_layout(width="auto"), shared_layout(width="auto")
        >>> a is b, len(made)
        (True, 1)
        >>> a.close()
    """
    made = _SCOPE.get()
    if made is None:
        return W.Layout(**settings)
    key = tuple(sorted(settings.items()))
    layout = made.get(key)
    if layout is None:
        layout = made[key] = SharedLayout(**settings)
    return layout
