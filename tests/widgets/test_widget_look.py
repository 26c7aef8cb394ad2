"""The panel's samples and errors sections (issue 46), headless: real trainers, real widgets, no kernel.

Samples: the baseline first on the timeline, new samples while the run trains (the slider follows the newest), a
click on the loss chart's points picks the nearest sample, the two panes compare with text differences marked, a
failed sample function is said. Errors: after each validation the matrix equals ``trainer.interpret``'s, a click on a
cell lists that cell's items, the top-losses gallery shows the inputs; what cannot run is said and the run goes on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from widget_helpers import classes, make_widget, wait_for

from nbtrainer import Samples
from nbtrainer.widgets._samples_view import word_diff


class Probe:
    """A sample: the predicted classes of three fixed inputs, and a picture of the first layer's weights."""

    def __init__(self) -> None:
        self.x = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))

    def __call__(self, model: Any) -> dict[str, Any]:
        w = model[0].weight.detach()
        picture = (w - w.min()) / (w.max() - w.min())
        return {"predicted": " ".join(f"class {int(c)}" for c in model(self.x).argmax(1)), "weights": picture}


def test_the_samples_section_shows_the_baseline_and_follows_the_run() -> None:
    w = make_widget(callbacks=[Samples(Probe(), every_n_steps=8)], epochs=2, slow=0.004)
    view = w.looks.samples
    assert not view.section.visible and {"nbt-samples"} <= classes(w.panel)
    seen: list[list[int]] = []
    w.start()
    wait_for(lambda: len(view.steps) >= 2, 30, "samples while training")
    seen.append(list(view.steps))
    view.select_step(0)  # looking back while it trains: the slider stops following...
    w.wait()
    assert view.steps[0] == 0 and view.steps == sorted({s["step"] for s in w.history.samples})
    assert len(view.steps) > len(seen[0]) >= 2  # they came while the run trained, then more
    # ...and the run that has ended rests on its latest sample
    assert view.section.visible and view.slider.value == view.slider.max == len(view.steps) - 1
    assert f"step <b>{view.steps[-1]:,}</b>" in view.step_label.value
    assert "data:image/png;base64," in view.right.value and "data:image/png;base64," in view.left.value
    assert "step 0<" in view.left.value  # compared with the baseline by default
    assert "nbt-summary-samples" in (w.summary_html or "")  # the static summary left in the notebook shows them

    # a click on a point of the loss chart: the sample nearest that step
    hover = w.charts.loss_hover
    assert hover.interactions.get("click") == "select" and len(hover.x) > 10
    i = int(np.argmin(np.abs(np.asarray(hover.x) - 17)))
    hover.selected = np.array([i])
    nearest = min(view.steps, key=lambda s: abs(s - float(hover.x[i])))
    assert view.steps[view.slider.value] == nearest and hover.selected is None
    view.compare.value = "previous"
    assert f"step {view.steps[view.slider.value - 1]:,}<" in view.left.value
    view.compare.value = "none"
    assert view.left.value == ""


def test_text_differences_are_marked_word_by_word() -> None:
    left, right = word_diff("class 0 class 2 class 1", "class 0 class 1 class 1")
    assert left == "class 0 class <del class='nbt-diff-del'>2</del> class 1"
    assert right == "class 0 class <ins class='nbt-diff-ins'>1</ins> class 1"
    assert word_diff("<b>", "<i>") == (
        "<del class='nbt-diff-del'>&lt;b&gt;</del>",
        "<ins class='nbt-diff-ins'>&lt;i&gt;</ins>",
    )

    def head(model: Any) -> str:
        return f"loss head {float(model[2].bias[0]):.4f}"

    w = make_widget(callbacks=[Samples(head)], epochs=2)
    w.start()
    w.wait()
    assert "nbt-diff-del" in w.looks.samples.left.value and "nbt-diff-ins" in w.looks.samples.right.value


def test_a_failing_sample_function_is_said_and_the_run_goes_on() -> None:
    calls = {"n": 0}

    def flaky(model: torch.nn.Module) -> str:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ValueError("no prompt today")
        return "fine"

    w = make_widget(callbacks=[Samples(flaky)], epochs=3)
    w.start()
    history = w.wait()
    assert history.status == "finished"
    assert "no prompt today" in w.looks.samples.errors.value
    assert any("sample 'flaky' failed at step" in text for _, text in w.view.message_log)


def test_the_errors_section_matches_interpret_and_a_cell_click_lists_its_items() -> None:
    w = make_widget(interpret=True, epochs=2)
    w.start()
    w.wait()
    view = w.looks.errors
    interp = view.interpretation
    assert view.section.visible and interp is not None and interp.task == "classification"
    assert np.array_equal(view.heatmap.color, interp.confusion_matrix().numpy())
    assert "after epoch 2" in view.summary.value and "accuracy" in view.summary.value
    assert view.gallery.value.count("nbt-gallery-item") == 9 and "nbt-item-row" in view.gallery.value
    assert "precision" in view.table.value
    matrix = interp.confusion_matrix()
    off = [(i, j) for i in range(len(matrix)) for j in range(len(matrix)) if i != j and matrix[i, j] > 0]
    target, predicted = max(off, key=lambda c: int(matrix[c]))
    n = len(matrix)  # what a click on that cell's square sends: its index, row-major
    assert (view.cells.x[target * n + predicted], view.cells.y[target * n + predicted]) == (predicted, target)
    view.cells.selected = np.array([target * n + predicted])
    assert f"target {target}, predicted {predicted}: {int(matrix[target, predicted])} item(s)" in view.examples.value
    cards = [row.children[0].value for row in view.cleaner.items.children]  # each with keep / drop / relabel
    assert sum("nbt-gallery-item" in card for card in cards) == min(9, int(matrix[target, predicted]))
    assert {"nbt-errors", "nbt-errors-matrix", "nbt-errors-gallery", "nbt-errors-examples"} <= classes(w.panel)


def test_errors_refresh_after_each_validation_and_say_what_cannot_run() -> None:
    got: list[int] = []
    w = make_widget(interpret={"max_items": 50}, epochs=3)
    view = w.looks.errors
    original = view.show

    def record(interp: Any, *args: Any) -> None:
        got.append(len(interp.losses))
        original(interp, *args)

    view.show = record
    w.start()
    w.wait()
    assert got and all(n == 50 for n in got)
    with pytest.raises(ValueError, match=r"interpret=.*\) analyses the validation set: pass a val_loader"):
        make_widget(interpret=True, val=False)
    with pytest.raises(TypeError, match="takes the interpret options"):
        make_widget(interpret={"colour": "blue"})

    bad = make_widget(interpret=True, epochs=1)
    bad.trainer.criterion = lambda out, t: torch.nn.functional.cross_entropy(out, t)  # no reduction='none'
    bad.start()
    assert bad.wait().status == "finished"
    assert any("interpret failed" in text and "loss_per_item" in text for _, text in bad.view.message_log)
    assert "loss_per_item" in bad.looks.errors.summary.value


def test_no_css_variables_in_the_sections_widget_traits() -> None:
    """ipywidgets 7.7 refuses CSS variables in Color traits: the sections colour through CSS classes."""
    w = make_widget(callbacks=[Samples(lambda m: "x")], interpret=True, epochs=1)
    w.start()
    w.wait()
    found = []

    def walk(widget: Any) -> None:
        for name in widget.keys:
            value = getattr(widget, name, None)
            if name not in ("value", "_dom_classes") and isinstance(value, str) and "var(" in value:
                found.append((type(widget).__name__, name, value))
        for trait in ("layout", "style"):
            sub = getattr(widget, trait, None)
            if sub is not None and hasattr(sub, "keys"):
                walk(sub)
        for child in getattr(widget, "children", ()) or ():
            walk(child)
        for mark in getattr(widget, "marks", ()) or ():
            walk(mark)

    for part in (w.looks.samples.root, w.looks.errors.root):
        walk(part)
    assert not found, found
