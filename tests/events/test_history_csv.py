"""History.to_csv: the epoch table (the default), the step rows and the events, each readable by csv and pandas
whatever the fit reached."""

from __future__ import annotations

import csv
import io

import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import History, Trainer


def _rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def test_a_fit_that_ended_in_its_first_epoch_writes_an_epoch_table_with_a_header_and_its_steps_on_request(tmp_path):
    """max_steps=3 in an epoch of 8 steps: no epoch row. to_csv wrote one blank line, which csv reads as no columns
    and pandas refuses ('No columns to parse from file'); the steps the fit took were in no CSV."""
    x, y = make_classification(n=256)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, metrics={"acc": accuracy}, progress=False)
    history = trainer.fit(make_loader(x, y), epochs=2, max_steps=3)
    assert history.epochs == [] and history.steps["step"] == [1, 2, 3]

    text = history.to_csv(tmp_path / "epochs.csv")
    assert _rows(text) == (["epoch"], [])  # an empty table with its index column: zero epochs, said as such
    assert (tmp_path / "epochs.csv").read_bytes().decode() == text

    steps = history.to_csv(tmp_path / "steps.csv", what="steps")
    header, rows = _rows(steps)
    assert header == ["step", "epoch", "loss", "lr"]
    assert [int(r["step"]) for r in rows] == [1, 2, 3] and {r["epoch"] for r in rows} == {"1"}
    assert [float(r["loss"]) for r in rows] == history.steps["loss"]  # in full: csv writes a float's repr
    assert (tmp_path / "steps.csv").read_bytes().decode() == steps

    pd = pytest.importorskip("pandas")
    assert list(pd.read_csv(tmp_path / "epochs.csv").columns) == ["epoch"]
    assert pd.read_csv(tmp_path / "steps.csv")["loss"].tolist() == history.steps["loss"]


def test_the_epoch_table_and_the_events_as_csv():
    history = History()
    history.add_epoch({"epoch": 1, "loss": 0.5})
    history.add_epoch({"epoch": 2, "loss": 0.25, "val_loss": 0.75})
    history.add_event(step=3, epoch=1, kind="lr", old=0.1, new=0.05)
    assert history.to_csv() == history.to_csv(what="epochs")
    assert _rows(history.to_csv()) == (
        ["epoch", "loss", "val_loss"],
        [{"epoch": "1", "loss": "0.5", "val_loss": ""}, {"epoch": "2", "loss": "0.25", "val_loss": "0.75"}],
    )
    assert _rows(history.to_csv(what="events"))[1] == [
        {"step": "3", "epoch": "1", "kind": "lr", "old": "0.1", "new": "0.05"}
    ]
    assert _rows(History().to_csv(what="events")) == (["step", "epoch", "kind", "old", "new"], [])


def test_what_else_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"what must be 'epochs', 'steps' or 'events'.*samples.*to_json"):
        History().to_csv(what="samples")
