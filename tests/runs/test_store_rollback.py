"""The run store after ``Trainer.rollback`` mid-fit: it holds what the History holds, steps and epoch rows alike."""

from __future__ import annotations

import sqlite3

import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Runs, Trainer


class RollbackAt:
    """Saves a checkpoint at step ``save``; at step ``step`` (once) rolls back to it and lowers the LR, as Health's
    fix and a user do."""

    def __init__(self, path, save: int, step: int, stop_at: int | None = None) -> None:
        self.path, self.save, self.step, self.stop_at, self.done = str(path), save, step, stop_at, False

    def on_optimizer_step(self, trainer, step, skipped):
        if step == self.save and not self.done:
            trainer.save_checkpoint(self.path)
        if step == self.step and not self.done:
            self.done = True
            trainer.rollback(self.path)
            trainer.set_lr(1e-3)  # the steps trained again differ from the ones rolled back
        elif self.done and step == self.stop_at:
            trainer.request_stop("enough")


def _fit(tmp_path, roll):
    x, y = make_classification(n=16 * 8, d=10)
    model = mlp(hidden=16)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        scheduler=None,
        callbacks=[roll],
        progress=False,
        seed=0,
        refresh_interval=0.0,  # every step reaches the store before the rollback
        run_store=tmp_path / "runs.db",
    )
    history = trainer.fit(make_loader(x, y, batch_size=16, shuffle=True, seed=1), epochs=3)
    (event,) = [e for e in history.events if e["kind"] == "rollback"]
    assert (event["old"], event["new"]) == (17, 12) and trainer.run_id is not None
    return trainer, history, Runs(tmp_path / "runs.db")[trainer.run_id]


def test_the_store_after_a_rollback_holds_what_the_history_holds(tmp_path):
    """Rolled back from step 17 (epochs 1 and 2 recorded) to step 12 (epoch 1 only), then trained again at a lower
    LR: the stored steps and epoch rows are the History's, not the rolled-back ones, each step once."""
    _, history, run = _fit(tmp_path, RollbackAt(tmp_path / "at12.ckpt", save=12, step=17))
    assert history.steps["step"] == list(range(1, 25))
    stored = run.history
    assert stored.steps == history.steps  # the values trained after the rollback, at each step once
    assert stored.epochs == history.epochs
    assert run.steps == 24 and run.epochs == 3
    assert run.best["loss"] == min(history["loss"])
    assert any(e["kind"] == "rollback" for e in stored.events)
    db = sqlite3.connect(tmp_path / "runs.db")
    assert db.execute("SELECT COUNT(*) FROM steps WHERE run_id=?", (run.id,)).fetchone()[0] == 24


def test_a_fit_that_ends_soon_after_a_rollback_keeps_no_step_or_epoch_rolled_back(tmp_path):
    """Rolled back from step 17 to step 12 and stopped at step 14: the store ends at step 14 and epoch 1, as the
    History does, not at the rolled-back step 17 and epoch 2."""
    _, history, run = _fit(tmp_path, RollbackAt(tmp_path / "at12.ckpt", save=12, step=17, stop_at=14))
    assert history.steps["step"] == list(range(1, 15)) and [r["epoch"] for r in history.epochs] == [1]
    stored = run.history
    assert stored.steps == history.steps and stored.epochs == history.epochs
    assert run.steps == 14 and run.epochs == 1 and run.status == "stopped"
    assert run.best["loss"] == history.epochs[0]["loss"]
