"""What a real browser showed wrong in the panel (issue 26), checked on the widget state (no kernel, no browser).

The LR finder's axes (round ticks, markers inside, rule names off the curve), axis titles in the theme's text
colour, the 0-1 metrics axis zooming once values cluster, distinct names and checkpoint paths for two panels,
round LR ticks before any data, buttons as wide as their text, the epoch table following the newest rows,
the previous run's summary marked as such, and scales that never have an empty domain.
"""

from __future__ import annotations

import itertools
import math
import os
import re

import bqplot as bq
import ipywidgets as W
import numpy as np
import pytest
from widget_helpers import classes, make_widget

from nbtrainer.widgets._charts import LiveCharts
from nbtrainer.widgets._style import THEME_CSS
from nbtrainer.widgets._theme import FG
from nbtrainer.widgets._view import FOLLOW_ROWS


def _round_ticks(ticks) -> bool:
    """Evenly spaced by 1, 2 or 5 times a power of ten, each a whole multiple of the step."""
    ticks = [float(t) for t in ticks]
    if len(ticks) < 2:
        return False
    step = ticks[1] - ticks[0]
    mant = step / 10 ** math.floor(math.log10(step))
    even = all(math.isclose(b - a, step, rel_tol=1e-6) for a, b in itertools.pairwise(ticks))
    whole = all(abs(t / step - round(t / step)) < 1e-6 for t in ticks)
    return even and whole and any(math.isclose(mant, m, rel_tol=1e-6) for m in (1, 2, 5, 10))


def _decades(ticks) -> bool:
    return all(math.isclose(math.log10(t), round(math.log10(t)), abs_tol=1e-9) for t in ticks)


def _figures(charts: LiveCharts) -> list[bq.Figure]:
    return [charts.loss_fig, charts.lr_fig, charts.metrics_box.fig, charts.other_box.fig, charts.mem_box.fig]


def test_lr_finder_chart_has_round_ticks_every_marker_inside_and_rule_names_off_the_curve():
    w = make_widget(n=256, epochs=1)
    result = w.lr_find(min_lr=1e-7, max_lr=10.0, steps=60)
    view = w.lr_finder
    x_axis, y_axis = view.figure.axes
    # y: round 1-2-5 ticks inside the plotted range (was 0.0157, 0.0213, ...)
    ticks = list(y_axis.tick_values)
    assert _round_ticks(ticks), ticks
    assert all(y_axis.scale.min <= t <= y_axis.scale.max for t in ticks)
    # the axis title clears the widest tick label (about 7 px a character at the tick font size)
    widest = max(len(format(t, ".3g")) for t in ticks)
    assert int(y_axis.label_offset.removesuffix("px")) >= 7 * widest + 14, (y_axis.label_offset, ticks)
    # x: every LR drawn (curve, each rule's marker, minimum/10 included) is inside the axis range
    drawn = [*view.lrs.tolist(), *view.suggested.x.tolist()]
    assert "minimum/10" in result.suggestions and len(view.suggested.x) == len(
        [v for v in result.suggestions.values() if v]
    )
    assert x_axis.scale.min < min(drawn) and max(drawn) < x_axis.scale.max
    # few, whole-decade x ticks: readable in a 370 px panel (was one smeared string)
    assert 2 <= len(x_axis.tick_values) <= 5 and _decades(x_axis.tick_values), list(x_axis.tick_values)
    # rule names in the legend row above the plot, not drawn on the curve
    assert view.suggested.display_names is False
    for rule in result.suggestions:
        assert rule in view.legend.value
    assert all(a.label_color is None for a in view.figure.axes)  # the theme's colour comes from THEME_CSS


def test_every_axis_title_is_in_the_theme_text_colour():
    # not a trait (ipywidgets 7 rejects a CSS variable in a colour trait): a rule of the panel's stylesheet on
    # bqplot's own axis-title class, in every figure with an nbt- class, in JupyterLab's text colour
    charts = LiveCharts()
    assert FG.startswith("var(--jp-ui-font-color1")  # JupyterLab's text colour, light and dark
    assert re.search(r'\.bqplot\[class\*="nbt-"\] > svg \.axis text\.axislabel[^{]*\{fill:' + re.escape(FG), THEME_CSS)
    for fig in _figures(charts):
        assert [a.label_color for a in fig.axes] == [None, None], fig._dom_classes
        assert any(c.startswith("nbt-") for c in fig._dom_classes)


def test_bounded_metrics_zoom_to_the_data_once_values_cluster_and_the_menu_keeps_0_1():
    charts = LiveCharts()
    for e, (acc, val) in enumerate([(0.95, 0.94), (0.97, 0.955), (0.985, 0.962), (0.99, 0.968)], start=1):
        charts.add_epoch({"epoch": e, "steps": 10 * e, "loss": 0.1 / e, "acc": acc, "val_acc": val})
    charts.render()
    axis = charts.metrics_box.fig.axes[1]
    lo, hi = axis.scale.min, axis.scale.max
    assert 0.8 <= lo <= 0.94 and 0.99 <= hi <= 1.0, (lo, hi)  # still within 0-1, around the data
    assert _round_ticks(axis.tick_values) and all(lo - 1e-9 <= t <= hi + 1e-9 for t in axis.tick_values)
    assert "zoomed" in axis.label and "zoomed" in charts.metrics_box.legend.value
    # acc and val_acc now lie apart on screen: their gap is a sizeable share of the axis
    assert (0.99 - 0.968) / (hi - lo) > 0.1
    charts.metrics_scale.value = "full"
    charts.render()
    assert (axis.scale.min, axis.scale.max) == (0.0, 1.0) and "zoomed" not in axis.label
    # spread-out values keep the whole 0-1 axis under "auto"
    wide = LiveCharts()
    for e, acc in enumerate([0.2, 0.6, 0.9], start=1):
        wide.add_epoch({"epoch": e, "steps": e, "loss": 1.0, "acc": acc})
    wide.render()
    assert (wide.metrics_box.fig.axes[1].scale.min, wide.metrics_box.fig.axes[1].scale.max) == (0.0, 1.0)


def test_two_panels_have_distinct_names_titles_and_checkpoint_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = make_widget(n=64, epochs=1), make_widget(n=64, epochs=1)
    assert a.name != b.name and a.view.title.value != b.view.title.value
    assert a.view.save_path.value != b.view.save_path.value
    saved = {a.save_checkpoint(), b.save_checkpoint()}
    assert len(saved) == 2 and all(os.path.isfile(p) for p in saved)  # two files, neither overwritten
    named = make_widget(n=64, epochs=1, name="baseline run")
    assert named.name == "baseline run" and "baseline run" in named.view.title.value
    assert named.view.save_path.value == os.path.join("checkpoints", "baseline-run.ckpt")
    assert "baseline run" in repr(named)


def test_idle_lr_chart_has_a_few_round_ticks_around_the_optimizer_lr():
    w = make_widget(n=64, epochs=1)
    lr = w.trainer.lr
    scale, ticks = w.charts.lr_scale, list(w.charts.lr_fig.axes[1].tick_values)
    assert scale.min < lr < scale.max
    assert 2 <= len(ticks) <= 5 and all(scale.min <= t <= scale.max for t in ticks), ticks
    assert all(
        any(math.isclose(t / 10 ** math.floor(math.log10(t) + 1e-12), m, rel_tol=1e-9) for m in (1, 2, 5))
        for t in ticks
    ), ticks


def test_buttons_are_as_wide_as_their_text_so_the_lr_finder_does_not_wrap_alone():
    v = make_widget(n=64, epochs=1).view
    buttons = []

    def walk(widget):
        if isinstance(widget, W.Button):
            buttons.append(widget)
        for child in getattr(widget, "children", ()) or ():
            walk(child)

    walk(v.buttons)
    assert {b.description for b in buttons} >= {"Start", "Pause", "Stop", "Save checkpoint", "Profile", "LR finder"}
    assert all(b.layout.width == "auto" for b in buttons), [(b.description, b.layout.width) for b in buttons]
    # at most one fixed width in the row: the path box, narrower than the old 6 x 148 px of buttons
    assert int(v.save_path.layout.width.removesuffix("px")) <= 240
    assert v.buttons.layout.flex_flow == "row wrap"


def test_epoch_table_follows_the_newest_rows_and_says_how_many_are_hidden():
    v = make_widget(n=64, epochs=1).view
    rows = [{"epoch": e, "loss": 1.0 / e, "val_loss": 1.1 / e, "lr": 1e-3, "time": 0.5} for e in range(1, 33)]
    rows[3]["val_loss"] = 0.01  # the best val_loss is an early epoch, not shown: no bold for it in the window
    v.set_epoch_rows(rows)
    assert "nbt-epoch-follow" in v.epoch_table._dom_classes
    assert v.epoch_table.value.count("<tr>") == FOLLOW_ROWS + 1  # the newest rows only (and the header)
    assert "<td>32</td>" in v.epoch_table.value and "<td>24</td>" not in v.epoch_table.value
    assert v.epoch_table.value.count("<b>") == 1  # best loss (newest epoch) bold; best val_loss hidden above
    assert f"{32 - FOLLOW_ROWS} earlier hidden" in v.epoch_note.value and v.epoch_all.layout.display == "flex"
    assert v.epoch_table.layout.overflow == "auto"  # lr and time reachable in a narrow panel (sideways)
    v.epoch_all.value = True  # "show all": every row, a scroll box that opens at the newest
    assert "nbt-epoch-follow" not in v.epoch_table._dom_classes and "nbt-epoch-scrolls" in v.epoch_table._dom_classes
    assert "column-reverse" in v.epoch_table.value and "all 32 epochs" in v.epoch_note.value
    assert v.epoch_table.value.count("<tr>") == 33
    v.epoch_all.value = False
    v.set_epoch_rows(rows[:3])
    assert v.epoch_note.value == "" and v.epoch_all.layout.display == "none"


def test_a_new_run_marks_the_previous_summary_as_the_previous_run():
    w = make_widget(n=64, epochs=1, slow=0.01)
    w.start()
    w.wait()
    section = w.view.summary_section
    assert "summary" in section.title.value and "previous run" not in section.title.value
    w.start()
    try:
        assert "previous run" in section.title.value and "nbt-summary-previous" in section.root._dom_classes
        assert not section.is_open
        assert "previous run" in w._summary.bundle()["text/html"]
    finally:
        w.wait()
    assert "previous run" not in section.title.value and "nbt-summary-previous" not in section.root._dom_classes


def test_every_scale_has_a_domain_before_any_data_and_the_other_chart_joins_only_with_data():
    charts = LiveCharts()
    for fig in _figures(charts):
        for axis in fig.axes:
            assert axis.scale.min is not None and axis.scale.max is not None, fig._dom_classes
            assert axis.scale.max > axis.scale.min
    assert not charts.other_shown and charts.other_box.root not in charts.box.children
    charts.add_steps([(1, 2.0, 1e-3)])  # a lone first step: no zero-width x domain
    charts.render()
    assert charts.loss_x.max > charts.loss_x.min and charts.lr_x.max > charts.lr_x.min
    assert "nbt-chart-other" in classes(charts.other_box.root)


@pytest.mark.parametrize("values", [[], [0.5], [0.999, 1.0]])
def test_bounded_range_stays_within_0_1(values):
    from nbtrainer.widgets._chart_parts import bounded_range

    lo, hi, ticks = bounded_range(values, True)
    assert 0.0 <= lo < hi <= 1.0 and ticks and all(lo - 1e-9 <= t <= hi + 1e-9 for t in ticks)
    assert all(lo <= v <= hi for v in values)
    assert np.isfinite(ticks).all()


def test_a_section_is_shown_before_its_content_is_drawn():
    """A chart put into a hidden area measures 0 x 0 (bqplot: "negative width", an invisible plot): the area
    is opened (or folded) and displayed first, then the content arrives."""
    from nbtrainer.widgets._section import Section

    section, order = Section("LR finder", "nbt-test-area"), []
    section.root.layout.observe(lambda _: order.append("shown"), "display")
    section.body.layout.observe(lambda _: order.append("opened"), "display")
    section.body.observe(lambda _: order.append("content"), "children")
    section.set_open(False)
    order.clear()
    section.show(W.HTML("chart"))
    assert order == ["opened", "shown", "content"], order
    section.close()
    order.clear()
    section.show(W.HTML("summary"), is_open=False)  # folded from the start: never open for a moment
    assert order == ["opened", "shown", "content"] and not section.is_open, order
