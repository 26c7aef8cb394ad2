"""The panel as Python objects (no kernel, no browser): build, click Start, charts, history, summary."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
import torch
from widget_helpers import classes, make_widget, parts, wait_for

from nbtrainer import History, Trainer, TrainerWidget, format_number
from nbtrainer.widgets import ProfileCard

CSS = {
    "nbt-panel",
    "nbt-header",
    "nbt-status",
    "nbt-start",
    "nbt-pause",
    "nbt-stop",
    "nbt-save",
    "nbt-profile",
    "nbt-progress-step",
    "nbt-progress-epoch",
    "nbt-chart-loss",
    "nbt-chart-lr",
    "nbt-chart-metrics",
    "nbt-messages",
    "nbt-controls",
    "nbt-precision",
    "nbt-accum",
    "nbt-lr",
    "nbt-epochs",
    "nbt-scheduler",
    "nbt-clip",
    "nbt-checkpointing",
    "nbt-stats",
    "nbt-profile-area",
}


def test_lazy_reexports_and_all():
    import nbtrainer
    import nbtrainer.widgets as w

    assert nbtrainer.TrainerWidget is w.TrainerWidget and nbtrainer.ProfileCard is w.ProfileCard
    assert {"TrainerWidget", "ProfileCard"} <= set(w.__all__)
    assert all(name in w.__doc__ for name in ("nbt-panel", "nbt-chart-loss", "nbt-profile-card", "nbt-messages"))


class Held:
    """Holds the run at its first batch until ``gate`` is set (a state read mid-run is then not a race with its end)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def on_train_batch_start(self, trainer, batch, batch_idx) -> None:
        self.gate.wait(60)


def test_panel_builds_and_trains_without_a_kernel():
    from nbtrainer.widgets._notebook import in_notebook

    assert not in_notebook() and "ipykernel.kernelapp" not in sys.modules  # ipywidgets present, no kernel
    held = Held()  # the run holds at its first batch until its running state is read: 64 steps end in ~0.1 s
    w = make_widget(epochs=2, callbacks=[held])
    assert classes(w.panel) >= CSS, CSS - classes(w.panel)
    assert w.status == "idle" and w.view.start.disabled is False and w.view.stop.disabled is True
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.panel.model_id
    assert "Sequential" in w.view.title.value and "parameters" in w.view.title.value

    w.view.start.click()  # what the browser click does
    assert w.view.start.disabled and not w.view.stop.disabled
    held.gate.set()
    h = w.wait()
    assert isinstance(h, History) and h is w.history and h.status == "finished" and w.status == "finished"
    assert len(h) == 2 and len(h.steps["step"]) == 2 * 32
    pts = w.charts.sent_points()
    assert pts["loss"] == pts["lr"] == len(h.steps["step"]) == 64  # short run: every step drawn
    np.testing.assert_allclose(w.charts.raw.y, h.steps["loss"])
    np.testing.assert_allclose(w.charts.lr.y, h.steps["lr"])
    assert w.charts.val.y.tolist() == pytest.approx(h["val_loss"])
    # accuracy has its own 0-1 chart (never the loss axis): train solid, val dashed
    assert np.atleast_2d(w.charts.train_metrics.y).shape == (1, 2)
    assert np.atleast_2d(w.charts.val_metrics.y)[0].tolist() == pytest.approx(h["val_acc"])
    legend = w.charts.metrics_box.legend.value
    assert "acc" in legend and "val_acc" in legend and "loss" not in legend
    lo, hi = w.charts.metrics_box.fig.axes[1].scale.min, w.charts.metrics_box.fig.axes[1].scale.max
    acc = [*h["acc"], *h["val_acc"]]
    assert 0.0 <= lo <= min(acc) and max(acc) <= hi <= 1.0  # the 0-1 axis, zoomed when the values cluster
    assert w.view.epoch_bar.value == 2 and w.view.step_bar.value == 32
    assert "finished" in w.view.status.value and "step 64/64" in w.view.progress_info.value
    assert "best val_loss" in w.view.stats.value and format_number(min(h["val_loss"])) in w.view.stats.value
    assert not w.view.start.disabled and w.view.stop.disabled and w.view.pause.disabled
    assert w.ui_updates >= 1
    assert [m for m in w.view.message_log if m[0] != "info"] == []  # no drawing or update error was reported
    # the trainer is given back as it was: the panel's callback is removed
    assert all(type(cb).__name__ != "Feed" for cb in w.trainer.callbacks.callbacks)


@pytest.mark.parametrize("metrics", [["acc"], ["acc", "f1"]])
def test_charts_draw_each_epoch_as_it_ends(metrics):
    """The first epoch's row arrives alone (one point per series): bqplot squeezes a (1, 1) y to 0-d."""
    from nbtrainer.widgets._charts import LiveCharts

    charts = LiveCharts()
    charts.add_steps([(i, 1.0 / i, 1e-3) for i in range(1, 11)])
    for epoch in (1, 2):
        row = {"epoch": epoch, "steps": 10 * epoch, "loss": 1.0 / epoch, "val_loss": 1.1 / epoch}
        row.update(dict.fromkeys(metrics, 0.5 + 0.1 * epoch))
        row.update({f"val_{m}": 0.4 + 0.1 * epoch for m in metrics})
        charts.add_epoch(row)
        assert charts.render()
        for mark, names in ((charts.train_metrics, metrics), (charts.val_metrics, [f"val_{n}" for n in metrics])):
            y, x = np.atleast_2d(mark.y), mark.x.tolist()
            assert y.shape == (len(names), len(x))  # bounded metrics only: the loss is not on this axis
            assert sorted(set(x)) == list(range(1, epoch + 1))  # the first epoch may be drawn twice
            assert y[-1, -1] == pytest.approx(row[names[-1]])
        assert charts.val.x.tolist() == [10.0 * e for e in range(1, epoch + 1)]
        # one tooltip point per (metric, epoch)
        assert len(charts.metric_points.x) == 2 * len(metrics) * epoch
        assert all("epoch" in n for n in charts.metric_points.names)


def test_start_again_trains_on_with_a_fresh_history_and_charts():
    w = make_widget(epochs=1, val=False)
    w.start()
    h1 = w.wait()
    w.view.epochs.value = 2
    w.start()
    h2 = w.wait()
    assert h2 is not h1 and len(h2) == 2 and w.charts.sent_points()["loss"] == len(h2.steps["step"]) == 64
    assert h2.epochs[-1]["loss"] < h1.epochs[0]["loss"]  # same weights, trained further
    assert w.charts.val.x.size == 0  # no validation loader: no val points


def test_trainer_form_and_argument_errors():
    model, crit, opt, loader = parts()
    bars_during_fit: list[bool] = []

    class SeesCallbacks:
        # Read inside the run (not after start() returns, which a 1-epoch run can outlive on a loaded machine).
        def on_fit_start(self, trainer):
            bars_during_fit.append(any(type(cb).__name__ == "ProgressBar" for cb in trainer.callbacks.callbacks))

    trainer = Trainer(model, crit, opt, progress=True, refresh_interval=0.05, callbacks=[SeesCallbacks()])
    w = TrainerWidget(trainer, loader, epochs=1, ui_interval=0.05)
    assert w.trainer is trainer
    w.start()
    assert w.wait().status == "finished"
    assert bars_during_fit == [False]  # the panel shows progress itself while it runs
    assert any(type(cb).__name__ == "ProgressBar" for cb in trainer.callbacks.callbacks)  # given back
    with pytest.raises(TypeError, match="uses the trainer as configured"):
        TrainerWidget(trainer, loader, precision="bf16")
    with pytest.raises(TypeError, match="criterion, optimizer and train_loader"):
        TrainerWidget(model, crit)
    with pytest.raises(TypeError, match="train_loader is required"):
        TrainerWidget(trainer)
    with pytest.raises(ValueError, match="epochs"):
        TrainerWidget(trainer, loader, epochs=0)
    with pytest.raises(RuntimeError, match="has not been started"):
        TrainerWidget(trainer, loader).wait()


def test_schedule_menu_builds_onecycle_with_the_slider_as_max_lr():
    w = make_widget(epochs=2, val=False)
    assert w.view.scheduler.value == "constant" and w.view.lr.description == "LR"
    w.view.scheduler.value = "onecycle"
    assert w.view.lr.description == "max LR"
    w.view.lr.value = 0.2
    w.start()
    h = w.wait()
    lrs = h.steps["lr"]
    assert max(lrs) == pytest.approx(0.2, rel=0.05) and lrs[0] < 0.02 and lrs[-1] < 1e-3
    w.start()  # rebuilt for the second run (a used-up OneCycleLR would fail)
    assert w.wait().status == "finished"
    w.view.scheduler.value = "constant"
    w.start()
    lrs = w.wait().steps["lr"]
    assert lrs == pytest.approx([0.2] * len(lrs))


def test_precision_menu_and_unavailable_options():
    w = make_widget(epochs=1)
    support = w.controls.support
    labels = {v: k for k, v in w.view.precision.options}
    for name, (ok, _) in support.items():
        assert labels[name] == (name if ok else f"{name} (unavailable)")
    w.view.precision.value = "bf16-mixed"
    if support["bf16-mixed"][0]:
        assert w.trainer.precision == "bf16-mixed"
    else:
        assert w.view.precision.value == w.trainer.precision == "fp32"
    w.view.max_grad_norm.value = 1.5
    assert w.trainer.max_grad_norm == 1.5
    w.view.max_grad_norm.value = 0
    assert w.trainer.max_grad_norm is None


def test_activation_checkpointing_toggle():
    from widget_helpers import make_classification, make_loader

    torch.manual_seed(0)
    seq = torch.nn.Sequential
    model = seq(
        seq(torch.nn.Linear(10, 16), torch.nn.ReLU()),
        seq(torch.nn.Linear(16, 16), torch.nn.ReLU()),
        seq(torch.nn.Linear(16, 3)),
    )
    x, y = make_classification(n=64)
    checked = threading.Event()

    class HoldFirstBatch:  # the run stays running until the lock is checked (a loaded machine finished it first)
        def on_train_batch_start(self, trainer, batch, batch_idx):
            checked.wait(timeout=120)

    w = TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        make_loader(x, y, 16),
        progress=False,
        ui_interval=0.05,
        callbacks=[HoldFirstBatch()],
    )
    w.view.checkpointing.value = True
    assert w.trainer.checkpointed_blocks == ["0", "1", "2"]
    w.start()
    try:
        assert w.view.checkpointing.disabled  # locked while running
    finally:
        checked.set()
    assert w.wait().status == "finished"
    w.view.checkpointing.value = False
    assert w.trainer.checkpointed_blocks == [] and "forward" not in model[1].__dict__

    flat = make_widget(epochs=1)  # Linear, ReLU, Linear: nothing to checkpoint -> reverted with the reason
    flat.view.checkpointing.value = True
    assert flat.view.checkpointing.value is False and "no blocks" in flat.view.message_log[-1][1].lower()


def test_summary_is_static_html_with_svg_and_reaches_the_display_slot(monkeypatch):
    import IPython.display as disp

    shown, updates = [], []
    monkeypatch.setattr(disp, "display", lambda *a, **k: shown.append((a, k)))
    monkeypatch.setattr(disp, "update_display", lambda obj, **k: updates.append((obj, k)))
    w = make_widget(epochs=2)
    w._ipython_display_()
    assert shown[0][0][0].widget is w.panel  # with its text/plain and text/html fallback (_fallback)
    slot = shown[1][1]["display_id"]
    assert "nbt-summary-slot" in shown[1][0][0]["text/html"]
    w.start()
    h = w.wait()
    html = w.summary_html
    assert "nbt-summary" in html and "<svg" in html and "nbt-summary-table" in html and "<polyline" in html
    assert format_number(h.last["val_acc"]) in html and "finished" in html
    assert updates and all(k["display_id"] == slot and k["raw"] for _, k in updates)
    # the slot's copy is marked static (hidden by the panel's style where widgets render)
    static = updates[-1][0]["text/html"]
    assert static == f"<div class='nbt-summary-static'>{html}</div>" and "finished" in updates[-1][0]["text/plain"]
    assert ".nbt-summary-static{display:none}" in w._hide_static.value and w._hide_static in w.panel.children
    # and the panel shows the same summary in its own (collapsed) section: Voila never re-renders the slot
    assert w.view.summary.value == html and w.view.summary_section.visible and not w.view.summary_section.is_open


@pytest.mark.slow
def test_profile_button_shows_a_profile_card():
    w = make_widget(epochs=1)
    w.view.profile.click()
    wait_for(lambda: w.view.profile_area.children, 60, "profile card")
    card = w.view.profile_area.children[0]
    assert isinstance(card, ProfileCard) and "nbt-profile-card" in card._dom_classes
    assert "parameters" in card.html.value and "latency" in card.html.value.lower()
    wait_for(lambda: not w.view.start.disabled, 10, "start re-enabled")


def test_profile_card_is_defensive_about_missing_keys():
    card = ProfileCard(
        {
            "model_name": "Net",
            "params": 1234,
            "latency_ms": {"cpu": {"fp16-mixed": {"supported": False, "reason": "no fp16 here"}}},
        }
    )
    assert "Net" in card.html.value and "1.23K" in card.html.value and "no fp16 here" in card.html.value
    assert ProfileCard({}).html.value  # nothing measured: still a card


@pytest.mark.slow
def test_profile_before_start_leaves_the_next_run_as_it_would_have_been():
    """Before: Profile read its batch with next(iter(loader)), and a DataLoader's iterator draws its seed from the
    global RNG: the next run's shuffle order and dropout masks differed from a run without Profile."""
    from torch.utils.data import DataLoader, TensorDataset

    def run(profile: bool) -> list[float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3)
        )
        x, y = torch.randn(128, 8), torch.randint(0, 3, (128,))
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)  # its order: the global RNG
        w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), loader,
                          epochs=1, device="cpu", progress=False, run_store=False)  # fmt: skip
        w.looks.data.wait_check()  # its forward is done (it puts the RNG back) before the seed below
        torch.manual_seed(1)
        if profile:
            w.profile(time_budget_s=0.05)
        w.start()
        return list(w.wait().steps["loss"])

    assert run(profile=True) == run(profile=False)
