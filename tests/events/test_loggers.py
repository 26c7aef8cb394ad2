"""TensorBoardLogger and CSVLogger: what a run writes, read back with TensorBoard's own EventAccumulator
and the csv module, compared with the run's History; mid-run LR / accumulation changes; resume."""

from __future__ import annotations

import csv
import os
import sys

import numpy as np
import pytest
import torch
from conftest import accuracy, make_classification, make_loader, mlp

from nbtrainer import CSVLogger, ModelCheckpoint, TensorBoardLogger, Trainer

BATCHES = 5  # optimizer steps per epoch (accumulation 1)


class Steer:
    """Changes the LR and the accumulation mid-run, from the fit thread (as the panel's requests land)."""

    def on_optimizer_step(self, trainer, step, skipped):
        if step == 3:
            trainer.set_lr(0.02)
        if step == 7:
            trainer.set_grad_accum_steps(2)


def _trainer(callbacks, seed=0):
    model = mlp(seed=seed)
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        metrics={"acc": accuracy},
        callbacks=callbacks,
        progress=False,
        seed=seed,
        refresh_interval=0.0,
    )


def _loaders():
    x, y = make_classification(n=BATCHES * 16)
    return make_loader(x, y, batch_size=16), make_loader(x, y, batch_size=40)


def _accumulator(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _series(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _approx(steps, values):
    return [(s, pytest.approx(v, rel=1e-6)) for s, v in zip(steps, values, strict=True)]  # event files hold float32


def test_tensorboard_logger_writes_steps_epochs_and_control_changes(tmp_path):
    train, val = _loaders()
    logger = TensorBoardLogger(tmp_path / "tb")
    h = _trainer([logger, Steer()]).fit(train, val, epochs=3)
    assert logger.run_dir == os.path.join(tmp_path / "tb", "version_0")
    acc = _accumulator(logger.run_dir)
    steps = h.steps
    assert _series(acc, "step/loss") == _approx(steps["step"], steps["loss"])
    assert _series(acc, "step/lr") == _approx(steps["step"], steps["lr"])
    for key in ("loss", "acc", "val_loss", "val_acc", "lr", "epoch", "samples_per_s"):
        got = _series(acc, f"epoch/{key}")
        assert got == [(row["steps"], pytest.approx(row[key], rel=1e-6)) for row in h.epochs], key
    assert _series(acc, "control/lr") == [(3, pytest.approx(0.02))]
    assert _series(acc, "control/grad_accum_steps") == [(0, 1.0), (7, 2.0)]
    texts = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors("control/text_summary")]
    assert texts == [(3, "step 3: lr 5.00e-2 -> 2.00e-2"), (7, "step 7: grad_accum_steps 1 -> 2")]
    assert acc.Tensors("status/text_summary")[0].tensor_proto.string_val[0].decode() == "finished"


def test_tensorboard_resume_replaces_what_came_after_the_checkpoint(tmp_path):
    train, _ = _loaders()
    log_dir, ckpt = tmp_path / "tb", str(tmp_path / "epoch2.ckpt")
    first = _trainer([TensorBoardLogger(log_dir)])
    first.fit(train, epochs=2)
    first.save_checkpoint(ckpt)
    first.fit_more(train, epochs=1)  # logged up to step 15, then "crashed": resume from the epoch-2 checkpoint
    resumed = _trainer([TensorBoardLogger(log_dir)], seed=3)
    h = resumed.fit(train, epochs=3, resume_from=ckpt)
    losses = _series(_accumulator(log_dir / "version_0"), "step/loss")
    assert [s for s, _ in losses] == list(range(1, 3 * BATCHES + 1))  # no duplicates of steps 11-15
    assert losses[2 * BATCHES :] == _approx(h.steps["step"], h.steps["loss"])[2 * BATCHES :]
    # A fresh run into the same folder gets a folder of its own; the resumed run's curves stay. (This test asserted
    # that the fresh run replaced them: the data a user had logged was lost.)
    _trainer([TensorBoardLogger(log_dir)], seed=5).fit(train, epochs=1)
    assert [s for s, _ in _series(_accumulator(log_dir / "version_1"), "step/loss")] == list(range(1, BATCHES + 1))
    assert _series(_accumulator(log_dir / "version_0"), "step/loss") == losses


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_csv_logger_files_match_the_history(tmp_path):
    train, val = _loaders()
    logger = CSVLogger(tmp_path / "csv")
    h = _trainer([logger, Steer()]).fit(train, val, epochs=3)
    epochs = _read(logger.epochs_path)
    assert len(epochs) == 3
    for row, ref in zip(epochs, h.epochs, strict=True):
        assert set(row) == set(ref)
        for key, value in ref.items():
            assert (float(row[key]) if isinstance(value, float) else int(row[key])) == value, key  # full precision
    steps = _read(logger.steps_path)
    assert [int(r["step"]) for r in steps] == h.steps["step"]
    assert [float(r["loss"]) for r in steps] == h.steps["loss"] and [float(r["lr"]) for r in steps] == h.steps["lr"]
    assert [int(r["epoch"]) for r in steps] == h.steps["epoch"]
    events = _read(logger.events_path)
    assert [(e["step"], e["kind"], e["old"], e["new"]) for e in events] == [
        ("3", "lr", "0.05", "0.02"),
        ("7", "grad_accum_steps", "1", "2"),
    ]


def test_csv_logger_resume_drops_rows_after_the_checkpoint(tmp_path):
    train, _ = _loaders()
    ckpt = str(tmp_path / "epoch2.ckpt")
    first = _trainer([CSVLogger(tmp_path / "csv")])
    first.fit(train, epochs=2)
    first.save_checkpoint(ckpt)
    first.fit_more(train, epochs=1)
    with open(tmp_path / "csv" / "steps.csv", "a") as fh:
        fh.write("16,4,0.")  # a half-written last row of a killed run
    logger = CSVLogger(tmp_path / "csv")
    h = _trainer([logger], seed=3).fit(train, epochs=3, resume_from=ckpt)
    steps = _read(logger.steps_path)
    assert [int(r["step"]) for r in steps] == list(range(1, 3 * BATCHES + 1)) == h.steps["step"]
    assert [float(r["loss"]) for r in steps] == h.steps["loss"]
    assert [int(r["epoch"]) for r in _read(logger.epochs_path)] == [1, 2, 3]


def test_loggers_write_nothing_on_other_ranks(tmp_path, monkeypatch):
    train, _ = _loaders()
    trainer = _trainer([TensorBoardLogger(tmp_path / "tb"), CSVLogger(tmp_path / "csv")])
    monkeypatch.setattr(trainer.strategy, "is_global_zero", False)  # this process as rank 1
    trainer.fit(train, epochs=1)
    assert not os.path.exists(tmp_path / "tb") and not os.path.exists(tmp_path / "csv")


def test_tensorboard_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r'pip install "nbtrainer\[tensorboard\]"'):
        TensorBoardLogger("runs")


def test_with_model_checkpoint_every_step(tmp_path):
    """Loggers and checkpoints both defer to the end of the event: order does not matter."""
    train, val = _loaders()
    logger = CSVLogger(tmp_path / "csv")
    h = _trainer([ModelCheckpoint(tmp_path / "ck", every_n_steps=1), logger]).fit(train, val, epochs=2)
    assert len(_read(logger.steps_path)) == len(h.steps["step"]) == 2 * BATCHES


class AddsLibraryValues:
    """What callbacks add to an epoch's row in practice: scikit-learn's scores are numpy scalars, torch's norms are
    tensors."""

    def on_epoch_end(self, trainer, epoch, logs):
        logs["f1"] = np.float64(0.25 * epoch)
        logs["f1_32"] = np.float32(0.5)
        logs["grad_norm"] = torch.tensor(1.5 * epoch)
        logs["per_class"] = np.array([0.5, 0.75])


def test_numpy_and_tensor_values_a_callback_adds_are_logged_and_the_checkpoint_loads(tmp_path):
    """Before: an np.float64 in the row made every later checkpoint unloadable (weights_only=True refuses numpy's
    pickles), TensorBoard dropped the np.float32 and the tensor, and epochs.csv held 'tensor(1.5000)'."""
    train, _ = _loaders()
    csv_logger, ckpt = CSVLogger(tmp_path / "csv"), ModelCheckpoint(tmp_path / "ck", save_last=True)
    tb_logger = TensorBoardLogger(tmp_path / "tb")
    h = _trainer([AddsLibraryValues(), ckpt, csv_logger, tb_logger]).fit(train, epochs=2)
    resumed = _trainer([]).fit(train, epochs=3, resume_from=ckpt.last_model_path)
    assert resumed.epochs[1]["f1"] == 0.5 and len(resumed.epochs) == 3
    assert [(r["f1"], r["f1_32"], r["grad_norm"], r["per_class"]) for r in h.epochs] == [
        (0.25, 0.5, 1.5, [0.5, 0.75]),
        (0.5, 0.5, 3.0, [0.5, 0.75]),
    ]
    acc = _accumulator(tb_logger.run_dir)
    for key in ("f1", "f1_32", "grad_norm"):
        assert _series(acc, f"epoch/{key}") == [(row["steps"], row[key]) for row in h.epochs], key
    rows = _read(csv_logger.epochs_path)
    assert [(r["f1"], r["f1_32"], r["grad_norm"]) for r in rows] == [("0.25", "0.5", "1.5"), ("0.5", "0.5", "3.0")]


def _runs_under(root, read):
    """``read(folder)`` for every folder under ``root`` that holds a run's files, in name order."""
    found = []
    for folder, _, files in sorted(os.walk(root)):
        if any(f.startswith("events.out.tfevents") or f == "steps.csv" for f in files):
            found.append(read(folder))
    return found


def _tb_losses(folder):
    return _series(_accumulator(folder), "step/loss")


def _tb_losses_by_file(folder):
    """``step/loss`` of each event file in the order they were written. TensorBoard reads a folder's files in name
    order, and two files one process writes in the same second are named by a counter that sorts as text (``.10``
    before ``.9``): a test's fits, a second apart at most, would be read out of order."""
    files = sorted(os.listdir(folder), key=lambda f: [int(part) for part in f.split(".") if part.isdigit()])
    return [point for f in files for point in _tb_losses(os.path.join(folder, f))]


def _csv_losses(folder):
    return [(int(r["step"]), float(r["loss"])) for r in _read(os.path.join(folder, "steps.csv"))]


@pytest.mark.parametrize("kind", ["tensorboard", "csv"])
def test_fresh_fits_into_one_folder_keep_every_run(tmp_path, kind):
    """Before: a second fresh fit into the folder (two Trainers sharing a logger, an Optuna sweep's trials) replaced
    the first run's curves (TensorBoard's purge at step 0, steps.csv opened with "w"): only the last run was left."""
    train, _ = _loaders()
    make, read = (TensorBoardLogger, _tb_losses) if kind == "tensorboard" else (CSVLogger, _csv_losses)
    shared = make(tmp_path / "logs")
    first = _trainer([shared]).fit(train, epochs=2)
    second = _trainer([shared], seed=1).fit(train, epochs=1)
    third = _trainer([make(tmp_path / "logs")], seed=2).fit(train, epochs=1)  # another logger, the same folder
    assert _runs_under(tmp_path / "logs", read) == [
        _approx(h.steps["step"], h.steps["loss"]) for h in (first, second, third)
    ]
    assert sorted(os.listdir(tmp_path / "logs")) == ["version_0", "version_1", "version_2"]


@pytest.mark.parametrize("kind", ["tensorboard", "csv"])
def test_fit_more_and_a_resume_from_a_new_process_continue_the_runs_folder(tmp_path, kind):
    """fit_more, and a resume by a new Trainer and logger (what a new process does), write into the folder of the
    run they continue, which the checkpoint names; a fresh fit between them has its own."""
    train, _ = _loaders()
    make, read = (TensorBoardLogger, _tb_losses_by_file) if kind == "tensorboard" else (CSVLogger, _csv_losses)
    ckpt = ModelCheckpoint(tmp_path / "ck", save_last=True)
    first = _trainer([make(tmp_path / "logs"), ckpt])
    first.fit(train, epochs=1)
    first.fit_more(train, epochs=1)
    other = _trainer([make(tmp_path / "logs")], seed=1).fit(train, epochs=1)
    resumed_logger = make(tmp_path / "logs")
    resumed = _trainer([resumed_logger, ModelCheckpoint(tmp_path / "ck", save_last=True)], seed=3)
    h = resumed.fit(train, epochs=3, resume_from=ckpt.last_path)
    assert resumed_logger.version == "version_0"
    assert _runs_under(tmp_path / "logs", read) == [
        _approx(h.steps["step"], h.steps["loss"]),
        _approx(other.steps["step"], other.steps["loss"]),
    ]
