"""How many widgets a panel makes, counted (issues 54 and 57): each widget is a comm the kernel opens and the front end
builds a model for when the panel is displayed (two panels' 1,518 set-up messages once outran ZeroMQ's queues), so
the areas a run may never show make their widgets when they first show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets
from widget_helpers import classes, make_widget

from nbtrainer import Samples


def _registry() -> dict[str, Any]:
    # ipywidgets 8 keeps the live widgets in Widget._active_widgets; 7 (the colab pass) in Widget.widgets
    return getattr(ipywidgets.Widget, "_active_widgets", None) or ipywidgets.Widget.widgets


def _made(build: Callable[[], Any]) -> tuple[Any, list[Any]]:
    before = set(_registry())
    out = build()
    return out, [w for key, w in list(_registry().items()) if key not in before]


def _with_class(made: list[Any], prefix: str) -> list[Any]:
    return [w for w in made if any(c.startswith(prefix) for c in getattr(w, "_dom_classes", ()))]


def test_a_default_panel_makes_no_widget_for_the_areas_it_does_not_show() -> None:
    w, made = _made(lambda: make_widget(epochs=1))
    # the errors section is off (interpret=False): one hidden box and its layout, nothing inside
    assert w.looks.errors.options is None and not w.looks.errors.root.children
    assert not _with_class(made, "nbt-errors")
    # nothing sampled: no samples section yet, its place an empty box
    assert w.looks.samples.section is None and not _with_class(made, "nbt-samples")
    # a hidden area has no header (title, collapse and close buttons): the profile, LR finder and summary areas
    for section in (w.view.profile_section, w.view.lrfinder_section, w.view.summary_section):
        assert not section.visible and "nbt-section-title" not in classes(section.root)
    # the whole panel: 552 widgets before the areas were made as they show, 416 after
    assert len(made) <= 430, len(made)


def test_an_area_makes_its_widgets_when_it_first_shows() -> None:
    w = make_widget(callbacks=[Samples(lambda m: "x", every_n_steps=8)], epochs=1)
    before = len(_registry())
    w.start()
    w.wait()
    view = w.looks.samples
    assert view.section is not None and view.section.visible and "nbt-samples-slider" in classes(w.panel)
    assert w.view.summary_section.visible and "nbt-section-title" in classes(w.view.summary_section.root)
    assert len(_registry()) > before  # made on the UI thread as they showed
