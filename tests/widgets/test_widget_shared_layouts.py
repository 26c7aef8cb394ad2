"""One layout (and style) per setting for a panel's widgets whose layout never changes (``widgets/_layouts.py``): a
shared one refuses a change (it would change every widget showing it), a redraw that closes the widgets it replaces
leaves the shared ones to the panel, and a whole panel's life (runs with every section on, clicks, Profile, the LR
finder) changes none of them and fails no drawing."""

from __future__ import annotations

from typing import Any

import ipywidgets as W
import pytest
from widget_helpers import make_widget

from nbtrainer.widgets._layouts import Shared, layout_scope, plain_html, shared_layout, shared_style
from nbtrainer.widgets._lifecycle import close_widgets, replace_children


def _registry() -> dict[str, Any]:
    return getattr(W.Widget, "_active_widgets", None) or W.Widget.widgets


def test_a_shared_layout_refuses_a_change_and_says_what_to_do_instead() -> None:
    with layout_scope() as made:
        a = W.Button(description="a", layout=shared_layout(width="auto"))
        b = W.Button(description="b", layout=shared_layout(width="auto"))
        c = W.Button(description="c", layout=shared_layout(width="120px"))
    assert a.layout is b.layout and a.layout is not c.layout and len(made) == 2
    with pytest.raises(AttributeError, match=r"shared by several .* own W\.Layout"):
        a.layout.display = "none"  # would hide b too
    assert b.layout.display is None and a.layout.width == "auto"
    with layout_scope() as styles:
        text, more = plain_html("a"), plain_html("b")
        button = W.Button(style=shared_style(W.Button))
    assert text.style is more.style and text.layout is more.layout and len(styles) == 3
    with pytest.raises(AttributeError, match="shared by several"):
        button.style.button_color = "red"
    close_widgets(text, more, button, *styles.values())
    # outside a panel's construction: a plain layout of the widget's own, which may change
    alone = W.Button(layout=shared_layout(width="auto"))
    assert type(alone.layout) is W.Layout
    alone.layout.display = "none"
    close_widgets(a, b, c, alone, *made.values())


def test_closing_replaced_widgets_leaves_the_layout_they_share_with_widgets_that_stay() -> None:
    with layout_scope() as made:
        rows = W.VBox([W.HTML("old", layout=shared_layout(width="auto"))])
        stays = W.HTML("stays", layout=shared_layout(width="auto"))
    replace_children(rows, (W.HTML("new"),))
    assert stays.layout.comm is not None, "a replaced row closed a layout another widget still shows"
    close_widgets(rows, stays, *made.values())  # as the panel closes: its shared layouts are roots
    assert stays.layout.comm is None and all(layout.comm is None for layout in made.values())


def test_a_panels_life_changes_no_shared_layout_and_fails_no_drawing() -> None:
    """Runs with the samples, errors, health and data sections on, Pause and Resume, two selections on the data map,
    Profile and the LR finder: no shared layout changed (a change would have raised, in a click or in the UI
    thread's push, which says "panel update failed" in the panel's messages), and the panel shares them widely."""
    from widget_helpers import Slow

    from nbtrainer import Samples

    def probe(model: Any) -> dict[str, Any]:
        return {"weights": model[0].weight.detach().abs()}

    before = set(_registry())
    w = make_widget(epochs=2, interpret=True, callbacks=[Samples(probe, every_n_steps=4), Slow(0.001)])
    made = [x for key, x in list(_registry().items()) if key not in before]
    shared: list[Any] = [x for x in made if isinstance(x, Shared)]
    states = {id(x): x.get_state() for x in shared}
    users = sum(isinstance(getattr(x, name, None), Shared) for x in made for name in ("layout", "style"))
    # 15 layouts and styles stand for the 154 that widgets of the panel had each before
    assert len(shared) <= 18 and users >= 140, (len(shared), users)
    w.start()
    w.pause()
    w.resume()
    w.wait()
    w.start()
    w.wait()
    data = w.looks.data
    for picked in ([0, 1, 2], [3, 4]):
        data.scatter.selected = picked
    w.profile(n_iters=2)
    w.lr_find(steps=8)
    errors = [text for level, text in w.view.message_log if level == "error"]
    assert errors == [], errors
    assert w.looks.samples.section.visible and w.looks.errors.section.visible and data.section.visible
    assert all(x.get_state() == states[id(x)] for x in shared)
    w.close()
    assert all(x.comm is None for x in shared)
