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


def _fit(callbacks, epochs, validate=True, resume_from=None):
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=callbacks,
        progress=False,
    )
    loader = make_loader(*make_classification(n=64))
    trainer.fit(loader, loader if validate else None, epochs=epochs, resume_from=resume_from)
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


class InOrder:
    """Sets val_loss to the next scripted value at each epoch end, whichever epoch a rollback made it."""

    def __init__(self, values):
        self.values = iter(values)

    def on_epoch_end(self, trainer, epoch, logs):
        logs["val_loss"] = next(self.values)


def test_a_resume_from_the_best_checkpoint_ranks_only_the_files_on_disk(tmp_path):
    # epoch 2's file saved the top 2 as of epoch 2 (epochs 2 and 1); epochs 3 and 4 then removed epoch 1's file. The
    # resume listed the removed file as kept: an epoch 3 of 0.6 lost to it and was not saved
    first = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=2)
    _fit([Scripted([0.5, 0.3, 0.4, 0.35]), first], epochs=4)
    names = ["epoch002-0.3000.ckpt", "epoch004-0.3500.ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    resumed = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=2)
    _fit([Scripted([0.5, 0.3, 0.6, 0.7]), resumed], epochs=4, resume_from=first.best_model_path)
    assert [score for score, _ in resumed.best_k] == [0.3, 0.6]
    assert all(os.path.isfile(path) for path in resumed.files())
    assert resumed.best_model_path == str(tmp_path / names[0])
    # the earlier run's epoch 4 is not the resumed run's to rank or remove: it stays, as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names, "epoch003-0.6000.ckpt"])
    assert _saved(tmp_path / names[1]) == (4, 0.35)


def test_a_rollback_to_the_best_checkpoint_keeps_the_files_written_after_it(tmp_path):
    # rolled back from epoch 5 to epoch 2's file: the rerun's epoch 4 wrote over the first epoch 4's epoch004.ckpt,
    # which the restored top 2 did not list
    class RollbackToBest:
        done = False

        def on_optimizer_step(self, trainer, step, skipped):
            if step == 9 and not self.done:  # epoch 5's first step, once
                self.done = True
                trainer.rollback(ck.best_model_path)

    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=2, filename="epoch{epoch:03d}")
    _fit([InOrder([0.5, 0.3, 0.4, 0.35, 0.45, 0.42, 0.6]), ck, RollbackToBest()], epochs=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch002.ckpt", "epoch004-v1.ckpt", "epoch004.ckpt"]
    assert _saved(tmp_path / "epoch004.ckpt") == (4, 0.35)  # the first epoch 4, as it was
    assert [score for score, _ in ck.best_k] == [0.3, 0.42]
    assert ck.best_k[1][1] == str(tmp_path / "epoch004-v1.ckpt") and _saved(ck.best_k[1][1]) == (4, 0.42)


def test_a_resume_into_another_directory_leaves_the_first_directory_alone(tmp_path):
    # the restored top 1 named a/epoch002.ckpt: the resumed run's better epoch 3 removed it from a directory it was
    # not given
    first = ModelCheckpoint(tmp_path / "a", save_top_k=1, save_last=True)
    _fit([first], epochs=2, validate=False)
    second = ModelCheckpoint(tmp_path / "b", save_top_k=1)
    _fit([second], epochs=4, validate=False, resume_from=first.last_model_path)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["epoch002.ckpt", "last.ckpt"]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["epoch004.ckpt"]
    assert second.best_model_path == str(tmp_path / "b" / "epoch004.ckpt") and second.last_model_path is None
