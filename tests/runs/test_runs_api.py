"""``nbtrainer.Runs``: the table, overlays, histories, tags, delete and diff, on runs fitted here."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

import nbtrainer
from nbtrainer import Runs, Trainer


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "runs.db"
    x, y = make_classification(n=96)
    train, val = make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32], batch_size=16)
    fits = {}
    for name, lr, accum in (("a", 0.1, 1), ("b", 0.01, 1), ("c", 0.1, 2)):
        trainer = Trainer(
            mlp(seed=1), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, grad_accum_steps=accum, progress=False,
            metrics={"acc": accuracy}, run_store=path, refresh_interval=0.0,
        )  # fmt: skip
        history = trainer.fit(train, val, epochs=3)
        fits[name] = (trainer.run_id, history)
    return path, fits


def test_table_has_one_row_per_run_with_settings_and_best_values(store):
    path, fits = store
    table = Runs(path).table()
    assert [r["id"] for r in table.rows] == [fits[k][0] for k in "abc"]
    row = table.rows[2]
    assert row["status"] == "finished" and row["lr"] == 0.1 and row["grad_accum_steps"] == 2
    assert row["optimizer"] == "SGD" and row["batch_size"] == 16 and row["model"] == "Sequential"
    assert row["epochs"] == 3 and row["steps"] == len(fits["c"][1].steps["step"]) == 9
    assert row["best_val_loss"] == min(fits["c"][1]["val_loss"])
    assert row["best_val_acc"] == max(fits["c"][1]["val_acc"])  # accuracy: higher is better
    assert row["duration_s"] > 0 and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row["started"])
    frame = table.to_pandas()
    assert list(frame.index) == [fits[k][0] for k in "abc"] and frame.loc[fits["b"][0], "lr"] == 0.01
    page = table._repr_html_()
    assert page.count("<tr data-run=") == 3 and "best_val_acc" in page


def test_plot_overlays_the_chosen_runs(store):
    path, fits = store
    runs = Runs(path)
    plot = runs.plot("val_loss", runs=[fits["a"][0], fits["b"][0]])
    svg = plot._repr_html_()
    assert svg.startswith("<svg") and svg.count("<polyline") == 2
    names = [c["run"].name for c in plot.curves]
    assert all(n in svg for n in names) and runs[fits["c"][0]].name not in svg
    assert plot.curves[0]["y"] == fits["a"][1]["val_loss"] and plot.curves[0]["x"] == [1.0, 2.0, 3.0]
    by_step = runs.curves("val_loss", [fits["c"][0]], x="step")[0]
    assert by_step["x"] == [3.0, 6.0, 9.0]  # each epoch's value at its last optimizer step
    loss = runs.curves("loss", fits["b"][0])[0]
    assert loss["y"] == fits["b"][1].steps["loss"]
    assert runs.plot("loss").to_svg().count("<polyline") == 3  # default: the latest runs
    with pytest.raises(ValueError, match=r"None of these runs logged 'val_f1'.*val_acc"):
        runs.plot("val_f1")


def test_run_lookup_history_tag_diff_delete(store, tmp_path):
    path, fits = store
    runs = Runs(path)
    a, b, c = (fits[k][0] for k in "abc")
    assert runs[a].history.steps == fits["a"][1].steps
    assert runs[a].history.epochs == fits["a"][1].epochs
    assert runs[-1].id == c and runs[a[:6]].id == a and runs[runs[b].name].id == b
    with pytest.raises(KeyError, match="no run with id or name 'nope'"):
        runs["nope"]
    assert runs.tag(a, "baseline", note="first try") == {"baseline": "", "note": "first try"}
    assert Runs(path)[a].tags == {"baseline": "", "note": "first try"}
    diff = runs.diff(a, c)
    assert diff["config.grad_accum_steps"] == (1, 2)
    assert "config.optimizer_params.lr" not in diff and "config.precision" not in diff
    assert runs.diff(a, b)["config.optimizer_params.lr"] == (0.1, 0.01)
    n = len(runs)
    runs.delete(b)
    assert len(runs) == n - 1 and b not in runs.ids
    assert runs.store.query("SELECT COUNT(*) FROM steps WHERE run_id=?", (b,))[0][0] == 0


def test_session_runs_by_default():
    x, y = make_classification(n=32)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    runs = nbtrainer.Runs()
    assert trainer.run_id is not None and runs.path is None and runs[trainer.run_id].status == "finished"
    assert runs.last.id == trainer.run_id


def test_runs_of_a_missing_file_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no run store at"):
        Runs(tmp_path / "nothing.db")


def test_run_names_stay_unique_after_a_delete(tmp_path):
    """Names were numbered by the count of runs: after deleting sequential-1, the third run was named sequential-2,
    the name of a run still in the store, and runs["sequential-2"] matched two runs."""
    path = tmp_path / "runs.db"
    x, y = make_classification(n=32)

    def fit(name=None):
        trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=path)
        trainer.run_recorder.name = name
        trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
        return trainer.run_id

    first, second = fit(), fit()
    runs = Runs(path)
    runs.delete(first)
    third = fit()
    assert runs[second].name == "sequential-2" and runs[third].name == "sequential-3"
    assert runs["sequential-2"].id == second
    named = [fit("baseline") for _ in range(3)]
    runs.delete(named[1])  # "baseline (2)"
    again = fit("baseline")
    assert [runs[r].name for r in (named[0], named[2], again)] == ["baseline", "baseline (3)", "baseline (4)"]


def _two_optimizers(head_lr):
    model = mlp()
    return {"body": torch.optim.SGD(model[0].parameters(), lr=0.01), "head": torch.optim.Adam(model[2].parameters(),
            lr=head_lr)}, model  # fmt: skip


def test_each_named_optimizer_is_recorded_and_diffed(tmp_path):
    """With optimizer={"body": SGD, "head": Adam} the run recorded the wrapper class "Optimizers" and the body's group
    only: two runs differing in the head's LR had an empty diff."""
    path = tmp_path / "runs.db"
    x, y = make_classification(n=32)
    ids: list[str] = []
    for head_lr in (0.003, 0.3):
        optimizers, model = _two_optimizers(head_lr)
        trainer = Trainer(model, torch.nn.CrossEntropyLoss(), optimizers, progress=False, run_store=path)
        trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
        assert trainer.run_id is not None
        ids.append(trainer.run_id)
    runs = Runs(path)
    config = runs[ids[0]].config
    assert config["optimizer"] == {"body": "SGD", "head": "Adam"}
    assert config["optimizer_params"]["body"]["lr"] == 0.01 and config["optimizer_params"]["head"]["lr"] == 0.003
    assert config["optimizer_params"]["head"]["betas"] == [0.9, 0.999]
    assert runs.diff(*ids) == {"config.optimizer_params.head.lr": (0.003, 0.3)}
    row = runs.table().rows[0]
    assert row["optimizer"] == "body: SGD, head: Adam" and row["lr"] == "body: 0.01, head: 0.003"
