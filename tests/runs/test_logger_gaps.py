"""What loggers keep at the edges of a fit: the steps a killed run had not flushed to steps.csv (written again on
resume, from the checkpoint's History)."""

from __future__ import annotations

import csv

import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import CSVLogger, ModelCheckpoint, Trainer

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
    _trainer([CSVLogger(csv_dir), ckpt]).fit(train, epochs=1)
    path = csv_dir / "steps.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]))  # header + steps 1, 2: the rest died in the killed process's buffer
    logger = CSVLogger(csv_dir)
    history = _trainer([logger, ModelCheckpoint(tmp_path / "ck", save_last=True)], seed=3).fit(
        train, epochs=2, resume_from=ckpt.last_path
    )
    rows = _steps(logger.steps_path)
    assert [s for s, _ in rows] == list(range(1, 2 * BATCHES + 1)) == history.steps["step"]
    assert [loss for _, loss in rows] == history.steps["loss"]


def test_a_resume_into_an_empty_csv_folder_writes_the_checkpoint_steps_too(tmp_path):
    train, _ = _loaders()
    ckpt = ModelCheckpoint(tmp_path / "ck", save_last=True)
    _trainer([ckpt]).fit(train, epochs=1)
    logger = CSVLogger(tmp_path / "fresh")
    history = _trainer([logger], seed=3).fit(train, epochs=2, resume_from=ckpt.last_path)
    assert [s for s, _ in _steps(logger.steps_path)] == history.steps["step"] == list(range(1, 2 * BATCHES + 1))
