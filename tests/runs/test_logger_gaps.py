"""What loggers keep at the edges of a fit: the steps a killed run had not flushed to steps.csv (written again on
resume, from the checkpoint's History), and the epoch row of a fit that a callback ends from ``on_epoch_end``
(OptunaPruning raises there) in TensorBoard and MLflow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import make_classification, make_loader, mlp, needs

from nbtrainer import CSVLogger, MLflowLogger, ModelCheckpoint, TensorBoardLogger, Trainer

BATCHES = 5


def _trainer(callbacks, seed=0):
    model = mlp(seed=seed)
    return Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks,
        progress=False, seed=seed, refresh_interval=0.0, run_store=False,
    )  # fmt: skip


def _loaders():
    x, y = make_classification(n=BATCHES * 16)
    return make_loader(x, y, batch_size=16), make_loader(x, y, batch_size=40)


def _steps(path):
    with open(path, newline="") as fh:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(fh)]


def test_a_resume_writes_the_steps_a_killed_run_had_not_flushed_to_steps_csv(tmp_path):
    """A killed run's steps.csv ends where its buffer was last flushed, before the checkpoint's step; the resume
    must fill steps 3..5 in from the checkpoint, not go on from 6."""
    train, _ = _loaders()
    csv_dir, ckpt = tmp_path / "csv", ModelCheckpoint(tmp_path / "ck", save_last=True)
    first = CSVLogger(csv_dir)
    _trainer([first, ckpt]).fit(train, epochs=1)
    path = Path(first.steps_path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))  # header + steps 1, 2: the rest died in the killed process's buffer
    logger = CSVLogger(csv_dir)
    history = _trainer([logger, ModelCheckpoint(tmp_path / "ck", save_last=True)], seed=3).fit(
        train, epochs=2, resume_from=ckpt.last_path
    )
    rows = _steps(logger.steps_path)
    assert logger.steps_path == str(path)  # the run's own folder, named by the checkpoint
    assert [s for s, _ in rows] == list(range(1, 2 * BATCHES + 1)) == history.steps["step"]
    assert [loss for _, loss in rows] == history.steps["loss"]


def test_a_resume_into_an_empty_csv_folder_writes_the_checkpoint_steps_too(tmp_path):
    train, _ = _loaders()
    ckpt = ModelCheckpoint(tmp_path / "ck", save_last=True)
    _trainer([ckpt]).fit(train, epochs=1)
    logger = CSVLogger(tmp_path / "fresh")
    history = _trainer([logger], seed=3).fit(train, epochs=2, resume_from=ckpt.last_path)
    assert [s for s, _ in _steps(logger.steps_path)] == history.steps["step"] == list(range(1, 2 * BATCHES + 1))


def test_a_resume_into_a_new_tensorboard_folder_writes_the_checkpoint_history_too(tmp_path):
    """A checkpoint saved without the logger names no folder: the resume starts a new one, which must hold the run
    from its first step (as CSVLogger's does), not from the checkpoint's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, val = _loaders()
    ckpt = ModelCheckpoint(tmp_path / "ck", save_last=True)
    _trainer([ckpt]).fit(train, val, epochs=1)
    logger = TensorBoardLogger(tmp_path / "tb")
    history = _trainer([logger], seed=3).fit(train, val, epochs=2, resume_from=ckpt.last_path)
    acc = EventAccumulator(logger.run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    steps = history.steps
    assert [(e.step, e.value) for e in acc.Scalars("step/loss")] == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in zip(steps["step"], steps["loss"], strict=True)
    ]
    assert [(e.step, e.value) for e in acc.Scalars("epoch/val_loss")] == [
        (row["steps"], pytest.approx(row["val_loss"], rel=1e-6)) for row in history.epochs
    ]


class EndAtFirstEpoch:
    """Ends the fit from on_epoch_end, as OptunaPruning does when the pruner says so."""

    def on_epoch_end(self, trainer, epoch, logs):
        raise RuntimeError("ended from on_epoch_end")


def test_the_epoch_a_callback_ends_the_fit_at_reaches_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train, val = _loaders()
    logger = TensorBoardLogger(tmp_path / "tb")
    trainer = _trainer([logger, EndAtFirstEpoch()])
    with pytest.raises(RuntimeError, match="ended from on_epoch_end"):
        trainer.fit(train, val, epochs=3)
    acc = EventAccumulator(logger.run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    row = trainer.history.epochs[0]
    assert [(e.step, e.value) for e in acc.Scalars("epoch/val_loss")] == [
        (BATCHES, pytest.approx(row["val_loss"], rel=1e-6))
    ]


@needs("mlflow")
def test_the_epoch_a_callback_ends_the_fit_at_reaches_mlflow(mlflow_uri):
    import mlflow

    uri = mlflow_uri
    train, val = _loaders()
    logger = MLflowLogger(uri, experiment="ended")
    trainer = _trainer([logger, EndAtFirstEpoch()])
    with pytest.raises(RuntimeError, match="ended from on_epoch_end"):
        trainer.fit(train, val, epochs=3)
    assert logger.error is None
    client = mlflow.MlflowClient(uri)
    history = client.get_metric_history(logger.run_id, "val_loss")
    assert [(m.step, m.value) for m in history] == [(BATCHES, pytest.approx(trainer.history.epochs[0]["val_loss"]))]
    assert client.get_run(logger.run_id).info.status == "FAILED"
