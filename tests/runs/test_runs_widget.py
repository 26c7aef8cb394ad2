"""RunsWidget (table with selection, overlay chart for any metric) and the live tune view (trial curves, pruned
muted, best highlighted, Stop after the current trial), on real runs; no kernel, no browser."""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import LazyModule, make_classification, make_loader, mlp, needs

from nbtrainer import Runs, RunsWidget, Trainer
from nbtrainer.plotting import PALETTE
from nbtrainer.widgets import TuneView

pytestmark = needs("optuna")
optuna = LazyModule("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def data():
    x, y = make_classification(n=96)
    return make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32], batch_size=32)


def test_runs_widget_table_selection_and_overlay(data, tmp_path):
    path = tmp_path / "runs.db"
    ids: list[str] = []
    for lr in (0.3, 0.1, 0.01):
        trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, progress=False, run_store=path)
        trainer.fit(data[0], data[1], epochs=2)
        assert trainer.run_id is not None
        ids.append(trainer.run_id)
    widget = RunsWidget(Runs(path))
    assert [v for _, v in widget.select.options] == ids and widget.selected == ids
    assert widget.metric.value == "val_loss" and {"loss", "lr", "val_loss"} <= set(widget.metric.options)
    assert len(widget.figure.marks) == 3 and widget.table.value.count("class='nbt-run-selected'") == 3
    history = Runs(path)[ids[0]].history
    assert list(widget.figure.marks[0].y) == history["val_loss"]
    widget.select.value = (ids[1],)
    widget.metric.value = "loss"
    (mark,) = widget.figure.marks
    assert list(mark.y) == Runs(path)[ids[1]].history.steps["loss"] and widget.figure.axes[0].label == "step"
    widget.x.value = "epoch"
    assert widget.figure.axes[0].label == "epoch" and list(widget.figure.marks[0].x) == [1.0, 2.0]
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.2, progress=False, run_store=path)
    trainer.fit(data[0], data[1], epochs=1)
    widget.refresh_button.click()  # a run written since: listed, the selection kept
    assert len(widget.select.options) == 4 and widget.selected == [ids[1]]
    bundle = widget._repr_mimebundle_()  # the widget view (on ipywidgets 7 and 8) and a readable fallback
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.root.model_id
    assert bundle["text/plain"].startswith("runs") and "VBox(" not in bundle["text/plain"]


def test_tune_view_shows_trials_live_and_stops_after_the_current_trial(data, tmp_path):
    go = threading.Event()
    holder: dict[str, TuneView] = {}

    def build(trial):
        go.wait(60)
        lr = trial.suggest_categorical("lr", [1e-7, 0.5, 0.3, 0.2, 0.1])
        if trial.number == 2:
            holder["view"].stop()  # clicked while trial 2 trains: it finishes, no trial 3 starts
        trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, progress=False, run_store=False)
        return trainer, *data

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    queued = optuna.create_study(storage=storage, study_name="live")
    for lr in (1e-7, 0.5, 0.3):  # a hopeless trial first (pruned), then two that learn
        queued.enqueue_trial({"lr": lr})
    view = RunsWidget.tune(
        build, show=False, n_trials=5, epochs=3, storage=storage, study_name="live",
        pruner=optuna.pruners.ThresholdPruner(upper=1.05),
    )  # fmt: skip
    holder["view"] = view
    go.set()
    study = view.wait(timeout=240)
    assert study is not None and view.done and len(study.trials) == 3
    assert [t["number"] for t in view.trials] == [0, 1, 2]
    states = {t["number"]: t["state"] for t in view.trials}
    assert states == {t.number: t.state.name.lower() for t in study.trials}
    assert states == {0: "pruned", 1: "complete", 2: "complete"}
    best = view.best()
    assert best is not None and best["number"] == study.best_trial.number
    marks = {m.labels[0]: m for m in view.figure.marks}
    top = marks[f"trial {best['number']}"]
    assert top.colors == [PALETTE[1]] and top.stroke_width == 3  # the best: highlighted
    assert marks["trial 0"].colors == ["#8b949e"] and marks["trial 0"].opacities == [0.45]  # pruned: muted
    assert len(marks["trial 0"].y) == 1 and len(marks["trial 1"].y) == 3
    for t in view.trials:
        assert list(marks[f"trial {t['number']}"].y) == t["y"]
    assert "done: 3 trials" in view.status.value and view.stop_button.disabled
    assert view.table.value.count("<tr") == 4
