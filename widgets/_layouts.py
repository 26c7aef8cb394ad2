"""One ``Layout`` (and one style) for each setting a panel uses, shared by every widget of that panel that never
changes its own.

Every ipywidgets widget has a ``Layout``, and most have a style (``HTMLStyle``, ``ButtonStyle``...); each is a widget
of its own. A layout is about 36 traits sent in a comm-open message, 0.19 ms to build here and a model in the page
for as long as the panel lives. A panel made 171 layouts, 36% of its build time, though they held only 40 different
settings, and 92 styles, 78 of them as they come. Both can be shared: the front end draws each widget from the
layout and style models it names (ipywidgets 7 and 8 alike).

A shared layout or style must never change, or every widget sharing it would change with it (a ``display = "none"``
would hide them all): a :class:`Shared` one refuses any change. A widget whose layout changes (shown and hidden,
resized) keeps a ``W.Layout`` of its own.

The sharing is per panel, never across panels: :func:`layout_scope` collects what is made while a panel is built,
the panel closes it with itself (:func:`close_widgets` leaves it to the panel, since the widgets a redraw replaces
may share it with widgets that stay). Outside a scope (rows made at a click or by the UI thread),
:func:`shared_layout` and :func:`shared_style` make a plain one of the widget's own, closed with it as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import ipywidgets as W

__all__ = ["Shared", "layout_scope", "plain_html", "shared_layout", "shared_style"]

_Made = dict[tuple[Any, ...], W.Widget]
_SCOPE: contextvars.ContextVar[_Made | None] = contextvars.ContextVar("nbtrainer_layout_scope", default=None)


class Shared:
    """Mixed into a layout or style class: the widget refuses any change once built."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False) and name in self.keys:  # type: ignore[attr-defined]
            raise AttributeError(
                f"this {type(self).__mro__[2].__name__} is shared by several of the panel's widgets, so setting "
                f"{name!r} would change them all: give the widget that changes its own W.Layout(...) or style "
                "instead of shared_layout(...) / shared_style(...)"
            )
        super().__setattr__(name, value)


_SHARED_CLASSES: dict[type, type] = {}  # Layout -> SharedLayout, HTMLStyle -> SharedHTMLStyle...


def _shared_class(klass: type) -> type:
    if klass not in _SHARED_CLASSES:
        _SHARED_CLASSES[klass] = type(f"Shared{klass.__name__}", (Shared, klass), {"__module__": __name__})
    return _SHARED_CLASSES[klass]


@contextlib.contextmanager
def layout_scope() -> Iterator[_Made]:
    """While a panel is built: :func:`shared_layout` and :func:`shared_style` hand out one widget per class and
    setting, kept in the dict yielded (the panel closes them when it closes)."""
    made: _Made = {}
    token = _SCOPE.set(made)
    try:
        yield made
    finally:
        _SCOPE.reset(token)


def _shared(klass: type, settings: dict[str, Any]) -> Any:
    made = _SCOPE.get()
    if made is None:
        return klass(**settings)
    key = (klass, *sorted(settings.items()))
    widget = made.get(key)
    if widget is None:
        widget = made[key] = _shared_class(klass)(**settings)
    return widget


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
    return _shared(W.Layout, settings)


def shared_style(widget_class: type[W.DOMWidget], **settings: Any) -> Any:
    """The current panel's style for ``widget_class`` (its own style class: ``HTMLStyle`` for an HTML on ipywidgets
    8, ``DescriptionStyle`` on 7) with ``settings``, or a new one outside a panel's construction."""
    return _shared(widget_class.class_traits()["style"].klass, settings)


def plain_html(value: str = "", **layout: str) -> W.HTML:
    """An HTML widget whose layout and style never change (its text does): both shared in a panel."""
    return W.HTML(value, layout=shared_layout(**layout), style=shared_style(W.HTML))
