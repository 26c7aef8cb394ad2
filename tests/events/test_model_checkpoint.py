"""ModelCheckpoint's files: what it names, keeps and removes in its directory."""

from __future__ import annotations

import errno
import os

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import CheckpointError, ModelCheckpoint, Trainer, load_checkpoint


class Scripted:
    """Sets val_loss to a scripted value per epoch, so the ranking is known exactly."""

    def __init__(self, values):
        self.values = list(values)

    def on_epoch_end(self, trainer, epoch, logs):
        logs["val_loss"] = self.values[epoch - 1]


def _fit(callbacks, epochs, validate=True):
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=callbacks,
        progress=False,
    )
    loader = make_loader(*make_classification(n=64))
    trainer.fit(loader, loader if validate else None, epochs=epochs)
    return trainer


def _saved(path):
    """(epochs done, val_loss) of the checkpoint file at path."""
    rows = load_checkpoint(path)["history"]["epochs"]
    return len(rows), rows[-1].get("val_loss")


def test_two_epochs_whose_values_format_alike_keep_both_files(tmp_path):
    # {val_loss:.1f} names 0.31 (epoch 1, the best) and 0.34 (epoch 3) both e-0.3: epoch 3 used to write over the
    # best file, leaving the top 2 as 0.34 and 0.5 with the 0.31 weights gone
    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=2, filename="e-{val_loss:.1f}")
    _fit([Scripted([0.31, 0.5, 0.34]), ck], epochs=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e-0.3-v1.ckpt", "e-0.3.ckpt"]
    assert [score for score, _ in ck.best_k] == [0.31, 0.34]
    assert [_saved(path) for _, path in ck.best_k] == [(1, 0.31), (3, 0.34)]
    assert ck.best_model_path == str(tmp_path / "e-0.3.ckpt")


def test_a_fixed_filename_is_one_file_replaced_by_each_better_epoch(tmp_path):
    # the file a save pushes out of the top k may be replaced: filename="best" stays best.ckpt
    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=1, filename="best")
    _fit([Scripted([0.5, 0.4, 0.45, 0.3, 0.35]), ck], epochs=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.ckpt"]
    assert ck.best_model_path == str(tmp_path / "best.ckpt") and _saved(ck.best_model_path) == (4, 0.3)


def test_a_second_fresh_fit_leaves_the_earlier_fits_files_on_disk(tmp_path):
    # the docs promise a fresh fit leaves an earlier fit's files on disk: the second fit wrote its epoch 3 over the
    # first fit's epoch003.ckpt, then removed it when its epoch 4 pushed it out of the top 1
    first = ModelCheckpoint(tmp_path, save_top_k=1)
    _fit([first], epochs=3, validate=False)
    second = ModelCheckpoint(tmp_path, save_top_k=1)
    _fit([second], epochs=5, validate=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch003.ckpt", "epoch005.ckpt"]
    assert _saved(tmp_path / "epoch003.ckpt")[0] == 3 and _saved(tmp_path / "epoch005.ckpt")[0] == 5
    assert second.best_model_path == str(tmp_path / "epoch005.ckpt")


def test_two_model_checkpoints_in_one_directory_keep_each_others_files(tmp_path):
    # both name epoch N epochNNN.ckpt: the top-1 one removed the files the top-3 one still listed as kept
    top1, top3 = ModelCheckpoint(tmp_path, save_top_k=1), ModelCheckpoint(tmp_path, save_top_k=3)
    _fit([top1, top3], epochs=4, validate=False)
    kept = top1.files() + top3.files()
    assert len(set(kept)) == 4 and all(os.path.isfile(path) for path in kept)
    assert sorted(_saved(path)[0] for path in top3.files()) == [2, 3, 4]
    assert _saved(top1.best_model_path)[0] == 4


def test_a_save_that_fails_leaves_the_ranking_on_the_files_that_exist(tmp_path, monkeypatch):
    # the disk fills at epoch 2's saves: best_model_path used to name epoch 2's file, never written, and the ranking
    # had dropped epoch 1's file, still on disk (a fit_more then ranked against the missing one)
    class DiskFillsAtEpoch2:
        def on_epoch_end(self, trainer, epoch, logs):
            if epoch == 2:  # the saves run after every callback's on_epoch_end
                monkeypatch.setattr(os, "write", full)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=1, save_last=True)
    with pytest.raises(CheckpointError, match="disk is full"):
        _fit([Scripted([0.5, 0.4]), DiskFillsAtEpoch2(), ck], epochs=2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch001-0.5000.ckpt", "last.ckpt"]
    assert ck.best_model_path == str(tmp_path / "epoch001-0.5000.ckpt") and [s for s, _ in ck.best_k] == [0.5]
    assert all(os.path.isfile(path) for path in ck.files())
    assert _saved(ck.best_model_path) == _saved(tmp_path / "last.ckpt") == (1, 0.5)
