"""The live charts as Python objects: axes a practitioner reads at a glance (issue 11).

Loss never below 0 and logarithmic past two decades (or when chosen), LR on a log axis with each change marked
at its new value and labels that do not overlap, bounded metrics on their own 0-1 axis and other metrics on
theirs, memory against capacity, every axis labelled, hover tooltips on every point layer.
"""

from __future__ import annotations

import math

import bqplot as bq
import numpy as np
import pytest

from nbtrainer.widgets._charts import LiveCharts


def _steps(losses, lrs=None):
    lrs = lrs if lrs is not None else [1e-3] * len(losses)
    return [(i + 1, float(v), float(lr)) for i, (v, lr) in enumerate(zip(losses, lrs, strict=True))]


def test_every_axis_is_labelled_and_point_layers_have_tooltips():
    charts = LiveCharts()
    figs = [charts.loss_fig, charts.lr_fig, charts.metrics_box.fig, charts.other_box.fig, charts.mem_box.fig]
    for fig in figs:
        assert all(axis.label for axis in fig.axes), [a.label for a in fig.axes]
        assert fig.title, "every chart says what it is"
        assert not fig.legend_location or all(not getattr(m, "display_legend", False) for m in fig.marks)
    for mark in (charts.val, charts.loss_hover, charts.lr_hover, charts.lr_events, charts.metric_points):
        assert isinstance(mark.tooltip, bq.Tooltip) and mark.interactions.get("hover") == "tooltip"
    scales = [s for fig in figs for m in fig.marks for s in m.scales.values()]
    assert all(s.allow_padding is False for s in scales)  # padding put negative ticks under a loss


def test_loss_axis_starts_at_zero_then_turns_log_past_two_decades():
    charts = LiveCharts()
    charts.add_steps(_steps([2.3, 1.9, 1.2, 0.9]))
    charts.render()
    assert charts.raw.scales["y"] is charts.loss_lin and charts.loss_lin.min == 0.0
    assert not charts.loss_is_log and charts.loss_fig.axes[1].label == "loss"
    charts.add_steps([(5 + i, 10 ** -(i / 3), 1e-3) for i in range(12)])  # down to 1e-4: four decades
    charts.render()
    assert charts.loss_is_log and all(m.scales["y"] is charts.loss_log for m in charts.loss_marks)
    assert charts.loss_fig.axes[1].scale is charts.loss_log and charts.loss_fig.axes[1].label == "loss (log)"
    ticks = charts.loss_fig.axes[1].tick_values
    assert len(ticks) >= 3 and all(math.log10(t) == round(math.log10(t)) for t in ticks)  # decades
    charts.loss_scale.value = "linear"  # the user's choice wins over "auto"
    charts.render()
    assert not charts.loss_is_log and charts.loss_lin.min == 0.0


def test_a_loss_below_zero_keeps_a_linear_axis_that_shows_it():
    charts = LiveCharts()
    charts.loss_scale.value = "log"
    charts.add_steps(_steps([0.5, -0.2, -1.0]))  # e.g. a negative log-likelihood
    charts.render()
    assert not charts.loss_is_log and charts.loss_lin.min < -1.0


def test_lr_is_on_a_log_axis_with_changes_at_the_new_value_and_no_overlapping_labels():
    charts = LiveCharts()
    charts.add_steps(_steps([1.0] * 100, [3.7e-2] * 40 + [3e-3] * 2 + [1e-4] * 58))
    for step, old, new in ((40, 3.7e-2, 3e-3), (42, 3e-3, 1e-4)):  # two changes 2 steps apart
        charts.add_event({"kind": "lr", "step": step, "old": old, "new": new})
    charts.add_event({"kind": "grad_accum_steps", "step": 60, "old": 1, "new": 4})
    charts.render()
    assert isinstance(charts.lr.scales["y"], bq.LogScale)
    lo, hi = charts.lr_scale.min, charts.lr_scale.max
    assert lo < 1e-4 and hi > 3.7e-2  # the small LR is as visible as the large one
    assert charts.lr_events.y.tolist() == pytest.approx([3e-3, 1e-4])  # at the new LR, not the old
    # each marker's tooltip says the change in full; the later label wins, the close one is not drawn
    assert list(charts.lr_events.names) == ["step 40: lr 3.70e-2 → 3.00e-3", "step 42: lr 3.00e-3 → 1.00e-4"]
    labels = {align: list(mark.text) for align, mark in charts.lr_labels.items()}
    assert labels == {"start": ["1.00e-4"], "end": []}, labels  # in the left half: it runs to the right
    assert charts.lr_labels["start"].y.tolist() == pytest.approx([1e-4])
    assert any("accumulation 1 → 4" in n for n in charts.loss_events.names)  # every change on the loss chart
    ticks = list(charts.lr_fig.axes[1].tick_values)
    assert len(ticks) >= 3 and all(lo <= t <= hi for t in ticks)


def test_a_constant_lr_still_gets_a_decade_of_axis_and_ticks():
    charts = LiveCharts()
    charts.add_steps(_steps([1.0] * 5, [3e-3] * 5))
    charts.render()
    assert charts.lr_scale.max / charts.lr_scale.min >= 10
    assert len(charts.lr_fig.axes[1].tick_values) >= 2


def test_bounded_metrics_get_a_0_1_axis_and_other_metrics_their_own_chart():
    charts = LiveCharts()
    for e in (1, 2, 3):
        charts.add_epoch(
            {
                "epoch": e,
                "steps": 10 * e,
                "loss": 2.0 / e,
                "val_loss": 2.1 / e,
                "acc": 0.5 + e / 10,
                "val_acc": 0.45 + e / 10,
                "mae": 9.0 / e,
                "val_mae": 9.5 / e,
                "rmse": 30.0 / e,
            }
        )
        charts.render()
    lo, hi = charts.metrics_box.fig.axes[1].scale.min, charts.metrics_box.fig.axes[1].scale.max
    assert 0.0 <= lo <= 0.55 and 0.8 <= hi <= 1.0  # acc's own axis: 0-1, zoomed to 0.55-0.8
    assert np.atleast_2d(charts.train_metrics.y).shape[0] == 1  # acc only: the loss is never on this axis
    assert charts.other_shown and charts.other_box.root in charts.box.children
    assert list(charts.other_choice.options) == ["mae", "rmse"] and charts.other_choice.value == "mae"
    assert charts.other_box.fig.axes[1].label == "mae"
    assert np.atleast_2d(charts.other.train.y)[0].tolist() == pytest.approx([9.0, 4.5, 3.0])
    charts.other_choice.value = "rmse"
    charts.render()
    assert np.atleast_2d(charts.other.train.y)[0].tolist() == pytest.approx([30.0, 15.0, 10.0])
    assert charts.other_box.fig.axes[1].scale.min == 0.0 and charts.other_box.fig.axes[1].scale.max >= 30.0


def test_an_accuracy_in_percent_is_not_forced_onto_0_1():
    charts = LiveCharts()
    charts.add_epoch({"epoch": 1, "steps": 10, "loss": 1.0, "acc": 87.5})
    charts.render()
    assert charts.other_shown and list(charts.other_choice.options) == ["acc"]


def test_memory_against_capacity():
    charts = LiveCharts()
    for step, used in ((10, 300 * 2**20), (20, 350 * 2**20), (30, 320 * 2**20)):
        charts.add_memory(step, used, 1 * 2**30)
    charts.render()
    assert charts.memory.y.tolist() == pytest.approx([300, 350, 320])  # MiB below 1 GiB
    assert charts.mem_box.fig.axes[1].label == "memory (MiB)"
    assert charts.mem.capacity.y.tolist() == pytest.approx([1024, 1024])  # the capacity line is within reach
    assert "of 1.00 GiB" in charts.mem_box.legend.value
    huge = LiveCharts()
    huge.add_memory(1, 300 * 2**20, 80 * 2**30)
    huge.render()
    assert len(huge.mem.capacity.y) == 0 and "of 80.0 GiB" in huge.mem_box.legend.value  # too far to draw


def test_long_runs_stay_bounded_per_mark():
    charts = LiveCharts(max_points=500)
    rng = np.random.default_rng(0)
    losses = list(np.abs(rng.normal(1.0, 0.1, 20_000)))
    losses[12_345] = 50.0
    charts.add_steps(_steps(losses))
    charts.render()
    sent = charts.sent_points()
    assert sent["loss"] <= 500 and sent["lr"] <= 500 and len(charts.loss_hover.x) <= 300
    assert 50.0 in charts.raw.y  # the spike survives the decimation


def test_thousands_of_epochs_send_a_bounded_epoch_chart_that_keeps_a_dip_and_the_newest_epoch():
    from nbtrainer.widgets._chart_parts import EPOCH_POINTS, HOVER_EPOCHS

    charts = LiveCharts()
    n, dip = 5000, 3210
    for e in range(1, n + 1):
        acc = 0.5 + 0.4 * e / n
        charts.add_epoch(
            {"epoch": e, "steps": 10 * e, "loss": 1.0, "acc": acc, "val_acc": 0.1 if e == dip else acc - 0.01}
        )
    charts.render()
    x = np.asarray(charts.train_metrics.x)
    assert len(x) <= EPOCH_POINTS and x[-1] == n and x[0] == 1
    assert np.array_equal(x, charts.val_metrics.x)  # one set of epochs for train and val (one x per mark)
    val = np.atleast_2d(charts.val_metrics.y)[0]
    assert val.min() == pytest.approx(0.1) and x[val.argmin()] == dip  # the dip survives, at its epoch
    names = list(charts.metrics.points.names)
    assert len(names) <= 2 * HOVER_EPOCHS  # two series, each with its hover points
    assert f"val_acc · epoch {dip}" in names and f"acc · epoch {n}" in names and f"val_acc · epoch {n}" in names


def test_every_step_and_epoch_axis_shows_whole_numbers_before_and_after_a_run():
    """bqplot splits a range evenly (0.2 steps on the empty 0..1, 25.75 on 1..100); the panel's step and epoch axes
    take explicit whole ticks, the health card's gradient norms from its first sampled step too."""
    from widget_helpers import make_widget

    from nbtrainer import Health

    w = make_widget(epochs=3, callbacks=[Health(every_n_steps=7)])

    def x_ticks() -> dict[str, list[float]]:
        figs = {
            "loss": w.charts.loss_fig,
            "lr": w.charts.lr_fig,
            "metrics": w.charts.metrics_box.fig,
            "other": w.charts.other_box.fig,
            "memory": w.charts.mem_box.fig,
            "health": w.health_card.fig,
        }
        return {k: [float(t) for t in f.axes[0].tick_values] for k, f in figs.items()}

    before = x_ticks()
    w.start()
    w.wait()
    after = x_ticks()
    assert w.health_card.chart.children, "the health chart is drawn"
    for ticks in (before, after):
        assert all(t and all(v == int(v) for v in t) for t in ticks.values()), ticks
    steps = w.history.steps["step"]
    health_steps = [s for s, _ in w.history.health["grad_norm"]["total"]]
    assert after["loss"][-1] <= steps[-1] and len(after["loss"]) >= 3
    assert health_steps[0] <= after["health"][0] and after["health"][-1] <= health_steps[-1], after["health"]


def test_the_gradient_norm_axis_labels_a_few_round_values_inside_its_range():
    """The health card's log axis: bqplot's own ticks label every 2..9 of each decade, crowding the labels over
    each other; the card gives at most 6 round values (powers of ten, or 1-2-5) inside the drawn range."""
    from widget_helpers import make_widget

    from nbtrainer import Health

    w = make_widget(epochs=3, callbacks=[Health(every_n_steps=7)])
    w.start()
    w.wait()
    axis, scale = w.health_card.fig.axes[1], w.health_card.y
    ticks = [float(t) for t in axis.tick_values]
    assert 1 <= len(ticks) <= 6 and all(scale.min <= t <= scale.max for t in ticks), (ticks, scale.min, scale.max)
    mantissas = {round(t / 10 ** math.floor(math.log10(t)), 6) for t in ticks}
    assert mantissas <= {1.0, 2.0, 5.0}, ticks
