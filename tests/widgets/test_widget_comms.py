"""How many widgets a panel makes, counted (issues 54 and 57): each widget is a comm the kernel opens and the front end
builds a model for when the panel is displayed (two panels' 1,518 set-up messages once outran ZeroMQ's queues). An
area that can never show makes none. Areas that may show during a run keep their widgets made at construction, on
the kernel's main thread: a widget made by the UI thread mid-run races the kernel's answer to ``comm_info`` (a loaded
trial's reload test waited 30 s for it, ipykernel 6), which iterates the comms while the new one is added."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets
from widget_helpers import make_widget


def _registry() -> dict[str, Any]:
    # ipywidgets 8 keeps the live widgets in Widget._active_widgets; 7 (the colab pass) in Widget.widgets
    return getattr(ipywidgets.Widget, "_active_widgets", None) or ipywidgets.Widget.widgets


def _made(build: Callable[[], Any]) -> tuple[Any, list[Any]]:
    before = set(_registry())
    out = build()
    return out, [w for key, w in list(_registry().items()) if key not in before]


def _with_class(made: list[Any], prefix: str) -> list[Any]:
    return [w for w in made if any(c.startswith(prefix) for c in getattr(w, "_dom_classes", ()))]


def test_a_panel_whose_errors_section_is_off_makes_none_of_its_widgets() -> None:
    w, made = _made(lambda: make_widget(epochs=1))
    # interpret=False (the default): the section can never show; one hidden box and its layout, nothing inside
    assert w.looks.errors.options is None and not w.looks.errors.root.children
    assert not _with_class(made, "nbt-errors")
    _, made_on = _made(lambda: make_widget(epochs=1, interpret=True))
    assert _with_class(made_on, "nbt-errors-matrix") and len(made_on) - len(made) >= 50, (len(made_on), len(made))
    # the whole default panel: 552 widgets before, 500 since
    assert len(made) <= 510, len(made)
