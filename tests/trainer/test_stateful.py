"""Stateful models (an LSTM language model trained with truncated BPTT, examples/stateful_lm.py): the events a
stateful compute_loss relies on fire when they should, and a run resumed mid-epoch equals the uninterrupted one."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nbtrainer import ModelCheckpoint, Trainer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "stateful_lm.py"


def _example():
    spec = importlib.util.spec_from_file_location("stateful_lm_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    """Events and compute_loss calls, in order (the compute_loss is this object too)."""

    def __init__(self):
        self.log = []

    def __call__(self, model, batch):
        self.log.append("compute_train" if model.training else "compute_eval")
        x, y = batch
        out = model(x)
        return torch.nn.functional.cross_entropy(out, y), out, y

    def on_fit_start(self, trainer):
        self.log.append("on_fit_start")

    def on_epoch_start(self, trainer, epoch):
        self.log.append(f"on_epoch_start {epoch}")

    def on_validation_start(self, trainer):
        self.log.append("on_validation_start")

    def on_validation_end(self, trainer, logs):
        self.log.append("on_validation_end")


def _recorded_trainer(rec, *, callbacks=()):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return Trainer(model, None, "sgd", lr=0.1, compute_loss=rec, callbacks=[rec, *callbacks], progress=False)


def _batches(n=4):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


def test_evaluate_fires_the_validation_events():
    rec = Recorder()
    trainer = _recorded_trainer(rec)
    logs = trainer.evaluate(_batches(2))
    assert rec.log == ["on_validation_start", "compute_eval", "compute_eval", "on_validation_end"]
    assert "val_loss" in logs


def test_fit_computes_no_batch_before_on_fit_start():
    rec = Recorder()
    trainer = _recorded_trainer(rec)
    trainer.fit(_batches(), _batches(2), epochs=1)
    assert rec.log[0] == "on_fit_start", rec.log
    # the first validation batch is still checked before training (after on_fit_start)
    assert rec.log[1] == "compute_eval" and rec.log[2] == "on_epoch_start 1", rec.log


def test_on_epoch_start_does_not_fire_again_for_an_epoch_resumed_mid_way(tmp_path):
    class StopAt:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 2:
                trainer.request_stop("test")

    rec = Recorder()
    trainer = _recorded_trainer(rec, callbacks=[ModelCheckpoint(tmp_path, every_n_steps=2, save_top_k=0)])
    trainer.add_callback(StopAt())
    trainer.fit(_batches(), epochs=2)
    rec2 = Recorder()
    resumed = _recorded_trainer(rec2, callbacks=[ModelCheckpoint(tmp_path, save_last=True, save_top_k=0)])
    resumed.fit(_batches(), epochs=2, resume_from="last")
    starts = [e for e in rec2.log if e.startswith("on_epoch_start")]
    assert starts == ["on_epoch_start 2"], rec2.log  # epoch 1 went on where it stopped
    assert rec2.log.count("compute_train") == 2 + 4


def _final(trainer, history):
    weights = {k: v.clone() for k, v in trainer.model_state_dict().items()}
    return weights, [r["loss"] for r in history.epochs], [r["val_loss"] for r in history.epochs], history.steps["loss"]


def test_stateful_lm_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path):
    lm = _example()
    torch.set_num_threads(1)
    train, val = lm.data()
    straight = lm.make_trainer()
    reference = _final(straight, straight.fit(train, val, epochs=2))

    class StopAt:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == len(train) + 7:  # mid-way through epoch 2
                trainer.request_stop("preempted")

    first = lm.make_trainer(callbacks=(ModelCheckpoint(tmp_path, every_n_steps=len(train) + 7, save_top_k=0),))
    first.add_callback(StopAt())
    assert first.fit(train, val, epochs=2).status == "stopped"
    hidden = first.callbacks.callbacks[1].hidden[True]  # the TBPTTLoss (after the history recorder)
    assert hidden is not None

    resumed = lm.make_trainer(callbacks=(ModelCheckpoint(tmp_path, save_last=True, save_top_k=0),))
    result = _final(resumed, resumed.fit(train, val, epochs=2, resume_from="last"))
    for key, value in reference[0].items():
        assert torch.equal(value, result[0][key]), key
    assert result[1:] == reference[1:]


@pytest.mark.slow
def test_stateful_lm_example_runs():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NBTRAINER_PROGRESS": "lines"}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", "3"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("epoch ")] == ["1/3", "2/3", "3/3"]
    assert lines[-1].startswith("finished: 3 epochs, val_acc="), lines[-1]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
