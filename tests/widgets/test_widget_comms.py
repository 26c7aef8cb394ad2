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
    # the section on makes its confusion matrix, tables and cleaner: 34 widgets (50 before its layouts and styles
    # were shared)
    assert _with_class(made_on, "nbt-errors-matrix") and len(made_on) - len(made) >= 30, (len(made_on), len(made))
    # the whole default panel: 552 widgets before, 500 since; 512 with the message area's lines made here (each an
    # HTML, its layout and its style) instead of a widget per message later, from the UI thread; 500 again with no
    # close button (and its layout and style) on the four areas that cannot close; 361 with one layout (and style) per
    # setting for the widgets whose layout never changes: 171 layouts and 92 styles before, 83 layouts (13 shared)
    # and 41 styles (2 shared) since (_layouts)
    assert len(made) <= 364, len(made)


def test_messages_are_new_text_in_lines_made_at_construction_never_new_widgets() -> None:
    """The message area gets messages from the panel's UI thread mid-run: none of them opens a comm."""
    import threading

    w = make_widget(epochs=1)
    log = w.view.messages_log

    def flood() -> None:
        for i in range(200):
            w.notify("warning" if i % 2 else "info", f"message {i}")

    def from_a_thread() -> None:
        thread = threading.Thread(target=flood)
        thread.start()
        thread.join()

    _, made = _made(from_a_thread)
    _, made_too = _made(lambda: setattr(log.show_all, "value", True))
    assert made == [] and made_too == [], (made, made_too)
    # what a person sees: the last three, each with its level's class; "show all" lists every one
    log.show_all.value = False
    lines = log.lines.children
    assert [line.value.count("message 19") for line in lines] == [1, 1, 1]
    assert [[c for c in line._dom_classes if c.startswith("nbt-message-")] for line in lines] == [
        ["nbt-message-warning"],
        ["nbt-message-info"],
        ["nbt-message-warning"],
    ]


def test_a_run_with_every_section_on_makes_no_widget_off_the_kernels_thread() -> None:
    """Start to the end of a run with the samples, errors, health and data sections on, then a second run: every
    widget is made on the thread that built the panel (the kernel's, which answers ``comm_info``), none by the
    panel's UI thread or the training thread."""
    from widget_helpers import Slow, widgets_made_elsewhere

    from nbtrainer import Samples

    def probe(model: Any) -> dict[str, Any]:
        return {"weights": model[0].weight.detach().abs()}

    w = make_widget(epochs=2, interpret=True, callbacks=[Samples(probe, every_n_steps=4), Slow(0.002)])
    with widgets_made_elsewhere() as off:
        for _ in range(2):
            w.start()
            w.wait()
            w.notify("warning", "between runs")  # a message after a run, as the panel's own are
    assert w.looks.samples.section.visible and w.looks.errors.section.visible  # the sections did show
    assert off == [], off


def test_closing_a_panel_closes_every_widget_it_made() -> None:
    """``w.close()`` closes the widgets the panel holds for later as well as those on screen: the samples' and the
    data map's areas before their first drawing, the epoch table, the health chart, the message lines, the other
    metric's chart. One left open stays in ipywidgets' registry (and its model in the page) for the kernel's life:
    a cell re-run ten times left 1,290 of them."""
    w, made = _made(lambda: make_widget(epochs=1))
    w.close()
    still = [type(x).__name__ for x in made if x.comm is not None]
    assert not still, f"{len(still)} of {len(made)} widgets left open: {sorted(set(still))}"


def test_closing_a_panel_after_runs_closes_every_widget_it_made() -> None:
    """The same after two runs with the samples, errors, health and data sections on (their areas drawn), two
    selections on the data map (each makes the cleaner's rows), and Profile and the LR finder twice each, the profile
    area closed by its X in between: what each replaces is closed then, what is left with the panel."""
    from nbtrainer import Samples

    def probe(model: Any) -> dict[str, Any]:
        return {"weights": model[0].weight.detach().abs()}

    def build_and_use() -> Any:
        w = make_widget(epochs=2, interpret=True, callbacks=[Samples(probe, every_n_steps=4)])
        for _ in range(2):
            w.start()
            w.wait()
        data = w.looks.data
        for picked in ([0, 1, 2], [3, 4]):
            data.scatter.selected = picked
            assert len(data.cleaner.items.children) == len(picked)
        for _ in range(2):
            w.profile(n_iters=2)
            close = w.view.profile_section.close_button
            assert close is not None
            close.click()
            w.lr_find(steps=8)
        return w

    w, made = _made(build_and_use)
    assert w.looks.samples.section.visible and w.looks.errors.section.visible
    w.close()
    still = [type(x).__name__ for x in made if x.comm is not None]
    assert not still, f"{len(still)} of {len(made)} widgets left open: {sorted(set(still))}"
