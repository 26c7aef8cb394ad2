"""Every param group's LR per optimizer step, with several groups (a backbone and a head at different LRs): in the
History (``lr`` stays group 0's, ``lr_group1``... as LRMonitor names them), read back from TensorBoard's event files,
CSVLogger's steps.csv and a real MLflow store, and carried whole through a checkpoint taken between refreshes."""

from __future__ import annotations

import csv
import os

import pytest
import torch
from conftest import make_classification, make_loader, mlp, needs

from nbtrainer import CSVLogger, LRMonitor, MLflowLogger, ModelCheckpoint, TensorBoardLogger, Trainer

BATCHES = 6  # micro-batches per epoch; accumulation 2: 3 optimizer steps per epoch
BODY_LR, HEAD_LR = 0.01, 0.1


def _trainer(callbacks, *, groups=2, refresh_interval=0.0):
    model = mlp()
    if groups == 2:
        params = [{"params": model[0].parameters(), "lr": BODY_LR}, {"params": model[2].parameters(), "lr": HEAD_LR}]
        lambdas = [lambda s: 1.0, lambda s: 0.5**s]  # the head's LR halves every step, the body's stays
    else:
        params, lambdas = [{"params": model.parameters(), "lr": BODY_LR}], [lambda s: 1.0]
    optimizer = torch.optim.SGD(params)
    return Trainer(
        model, torch.nn.CrossEntropyLoss(), optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas),
        scheduler_interval="step", grad_accum_steps=2, callbacks=callbacks, progress=False, seed=0,
        refresh_interval=refresh_interval, run_store=False,
    )  # fmt: skip


def _train():
    x, y = make_classification(n=BATCHES * 16)
    return make_loader(x, y, batch_size=16)


def _expected(steps):
    """The head's LR each step used (the scheduler moves it on after the step)."""
    return [pytest.approx(HEAD_LR * 0.5 ** (s - 1)) for s in steps]


def test_the_history_holds_each_groups_lr_per_step():
    """Before: only group 0's LR was recorded per step; the head's schedule was invisible between epochs."""
    history = _trainer([LRMonitor()]).fit(_train(), epochs=2)
    steps = history.steps
    assert steps["step"] == list(range(1, 7))
    assert steps["lr"] == pytest.approx([BODY_LR] * 6)  # group 0, as before
    assert steps["lr_group1"] == _expected(steps["step"])
    assert [row["lr_group1"] for row in history.epochs] == [steps["lr_group1"][2], steps["lr_group1"][5]]


def test_one_param_group_adds_no_column():
    assert set(_trainer([], groups=1).fit(_train(), epochs=1).steps) == {"step", "epoch", "loss", "lr"}


def test_a_checkpoint_between_refreshes_keeps_each_groups_lr(tmp_path):
    """The steps read but not yet delivered by a refresh go into the checkpoint's History with their groups' LRs."""
    ckpt = ModelCheckpoint(tmp_path / "ck", every_n_steps=2, save_last=True)
    _trainer([ckpt], refresh_interval=3600.0).fit(_train(), epochs=1)
    resumed = _trainer([], refresh_interval=3600.0).fit(_train(), epochs=2, resume_from=ckpt.last_path)
    assert resumed.steps["step"] == list(range(1, 7))
    assert resumed.steps["lr_group1"] == _expected(resumed.steps["step"])


def test_tensorboard_and_csv_log_each_groups_lr(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb, csv_logger = TensorBoardLogger(tmp_path / "tb"), CSVLogger(tmp_path / "csv")
    history = _trainer([tb, csv_logger]).fit(_train(), epochs=2)
    acc = EventAccumulator(tb.run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("step/lr_group1")] == list(
        zip(history.steps["step"], _expected(history.steps["step"]), strict=True)
    )
    with open(csv_logger.steps_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["lr_group1"]) for r in rows] == history.steps["lr_group1"]
    assert [float(r["lr"]) for r in rows] == history.steps["lr"]


@needs("mlflow")
def test_mlflow_logs_each_groups_lr(tmp_path, mlflow_uri):
    import mlflow

    uri = mlflow_uri
    logger = MLflowLogger(uri, experiment="groups", every_step=True)
    history = _trainer([logger]).fit(_train(), epochs=2)
    assert logger.error is None
    points = mlflow.MlflowClient(uri).get_metric_history(logger.run_id, "step/lr_group1")
    assert [(m.step, m.value) for m in points] == list(
        zip(history.steps["step"], _expected(history.steps["step"]), strict=True)
    )
    assert os.path.exists(tmp_path / "mlflow.db")
