"""Hyperparameter search with Optuna: pruning inside a fit, ``tune`` (each trial a tagged run), bad input."""

from __future__ import annotations

import sys

import pytest
import torch
from _launch import run_group
from conftest import LazyModule, make_classification, make_loader, mlp, needs

import nbtrainer
from nbtrainer import OptunaPruning, Runs, Trainer

pytestmark = needs("optuna")
optuna = LazyModule("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def data():
    x, y = make_classification(n=128)
    return make_loader(x, y, batch_size=16), make_loader(x[:64], y[:64], batch_size=32)


def _builder(data, store, **trainer_kw):
    train, val = data

    def build(trial):
        lr = trial.suggest_categorical("lr", [0.5, 1e-7, 0.2])
        trainer = Trainer(
            mlp(seed=0), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, progress=False, run_store=store, **trainer_kw
        )
        return trainer, train, val

    return build


def test_tune_prunes_records_and_tags_each_trial(data, tmp_path):
    store = tmp_path / "runs.db"
    grid = optuna.samplers.GridSampler({"lr": [0.5, 1e-7, 0.2]}, seed=0)
    # above 1.05 at any epoch is hopeless here (chance is ln 3 = 1.099): the pruner ends that trial at epoch 1
    study = nbtrainer.tune(
        _builder(data, store), n_trials=3, epochs=4, sampler=grid, pruner=optuna.pruners.ThresholdPruner(upper=1.05)
    )
    states = {t.params["lr"]: t.state for t in study.trials}
    assert states == {0.5: optuna.trial.TrialState.COMPLETE, 1e-7: optuna.trial.TrialState.PRUNED,
                      0.2: optuna.trial.TrialState.COMPLETE}  # fmt: skip
    runs = Runs(store)
    assert len(runs) == 3
    for trial in study.trials:
        run = runs[trial.user_attrs["nbtrainer_run_id"]]
        assert run.tags["optuna.trial"] == trial.number and run.tags["optuna.param.lr"] == trial.params["lr"]
        assert run.tags["optuna.study"] == study.study_name
        if trial.state == optuna.trial.TrialState.PRUNED:
            assert run.tags["optuna.state"] == "pruned" and run.status == "stopped" and run.epochs == 1
            assert (run.stop_reason or "").startswith(f"Optuna: trial {trial.number} pruned at epoch 1 (val_loss=")
        else:
            assert run.tags["optuna.state"] == "complete" and run.status == "finished" and run.epochs == 4
            assert trial.value == run.best["val_loss"]  # a trial's value: its best epoch
            assert list(trial.intermediate_values) == [1, 2, 3, 4]
    assert study.best_trial.value == min(t.value for t in study.trials if t.value is not None)


def test_a_study_in_storage_continues(data, tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    kw = {"epochs": 1, "storage": storage, "study_name": "s", "sampler": optuna.samplers.RandomSampler(seed=0)}
    nbtrainer.tune(_builder(data, False), n_trials=2, **kw)
    study = nbtrainer.tune(_builder(data, False), n_trials=1, **kw)
    assert len(study.trials) == 3 and optuna.load_study(study_name="s", storage=storage).trials[-1].number == 2


def test_maximize_a_metric(data):
    train, val = data

    def build(trial):
        lr = trial.suggest_float("lr", 0.05, 0.5, log=True)
        trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, progress=False,
                          metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()})  # fmt: skip
        return trainer, train, val

    study = nbtrainer.tune(build, n_trials=2, epochs=2, monitor="val_acc", direction="maximize")
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE and 0 <= study.best_value <= 1


def test_a_build_that_returns_the_wrong_thing_is_refused(data):
    train, val = data

    def only_trainer(trial):
        return Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)

    with pytest.raises(TypeError, match=r"must return \(trainer, train_loader, val_loader\).*got a Trainer"):
        nbtrainer.tune(only_trainer, n_trials=1, epochs=1)
    with pytest.raises(TypeError, match="first item of trial 0 is a DataLoader, not a Trainer"):
        nbtrainer.tune(lambda trial: (train, train, val), n_trials=1, epochs=1)
    with pytest.raises(ValueError, match="n_trials must be an int >= 1"):
        nbtrainer.tune(only_trainer, n_trials=0, epochs=1)


def test_pruning_a_key_the_fit_never_logs_is_refused_before_training(data):
    train, _ = data
    study = optuna.create_study()
    trial = study.ask()
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False,
                      callbacks=[OptunaPruning(trial, monitor="val_loss")])  # fmt: skip
    with pytest.raises(ValueError, match=r"OptunaPruning monitors 'val_loss'.*no val_loader"):
        trainer.fit(train, epochs=1)
    assert trainer.global_step == 0
    with pytest.raises(TypeError, match="needs the optuna Trial"):
        OptunaPruning("trial 1")


def test_missing_optuna_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"nbtrainer\[optuna\]"):
        nbtrainer.tune(lambda t: (None, None, None), n_trials=1, epochs=1)


_DDP_CHILD = """
import json, os, sys
import optuna, torch
from nbtrainer import OptunaPruning, Trainer

class PruneAtEpoch2(optuna.pruners.BasePruner):
    def prune(self, study, trial):
        return trial.last_step is not None and trial.last_step >= 2

rank = int(os.environ["RANK"])
# rank 0 asks a pruner that prunes at epoch 2; rank 1's trial would never be pruned: the ranks must agree on 0's
study = optuna.create_study(pruner=PruneAtEpoch2() if rank == 0 else optuna.pruners.NopPruner())
trial = study.ask()
torch.manual_seed(0)
x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
ds = torch.utils.data.TensorDataset(x, y)
trainer = Trainer(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)),
                  torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=sys.argv[2],
                  callbacks=[OptunaPruning(trial)])
pruned = False
try:
    trainer.fit(torch.utils.data.DataLoader(ds, batch_size=8), torch.utils.data.DataLoader(ds, batch_size=8), epochs=5)
except optuna.TrialPruned:
    pruned = True
out = {"pruned": pruned, "epochs": len(trainer.history.epochs), "status": trainer.status}
json.dump(out, open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w"))
"""


@pytest.mark.slow
def test_pruning_is_agreed_across_ddp_ranks(tmp_path):
    import json
    import os

    script = tmp_path / "ddp_prune.py"
    script.write_text(_DDP_CHILD)
    launched = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launched}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path), str(tmp_path / "runs.db")]  # fmt: skip
    proc = run_group(cmd, what="torchrun", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"pruned": True, "epochs": 2, "status": "stopped"}] * 2  # both leave at epoch 2
    (run,) = list(Runs(tmp_path / "runs.db"))  # rank 0 records; rank 1 does not
    assert run.status == "stopped" and run.epochs == 2 and "pruned at epoch 2" in (run.stop_reason or "")


def test_a_trial_that_fails_is_recorded_and_the_search_goes_on(data, tmp_path):
    """A diverging LR raises NonFiniteLossError in its fit, and a build raises for one trial: each of those trials is
    FAILED with its reason, the others complete, and tune returns the study."""
    train, val = data
    store = tmp_path / "runs.db"

    def build(trial):
        lr = trial.suggest_categorical("lr", [0.2, 1e6, 0.1, -1.0])
        if lr < 0:
            raise RuntimeError("no model for a negative lr")
        return Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=lr, progress=False, run_store=store), train, val

    grid = optuna.samplers.GridSampler({"lr": [0.2, 1e6, 0.1, -1.0]}, seed=0)
    study = nbtrainer.tune(build, n_trials=4, epochs=2, sampler=grid, pruner=optuna.pruners.NopPruner())
    by_lr = {t.params["lr"]: t for t in study.trials}
    states = {lr: t.state.name for lr, t in by_lr.items()}
    assert states == {0.2: "COMPLETE", 1e6: "FAIL", 0.1: "COMPLETE", -1.0: "FAIL"}
    diverged = by_lr[1e6]
    assert diverged.user_attrs["nbtrainer_error"].startswith("NonFiniteLossError: The training loss was non-finite")
    run = Runs(store)[diverged.user_attrs["nbtrainer_run_id"]]
    assert run.status == "failed" and run.tags["optuna.state"] == "failed"
    assert (run.stop_reason or "").startswith("NonFiniteLossError")
    assert by_lr[-1.0].user_attrs["nbtrainer_error"] == "build(trial): RuntimeError: no model for a negative lr"
    assert study.best_trial.params["lr"] in (0.2, 0.1)


def test_catch_chooses_which_failures_end_the_search():
    def build(trial):
        trial.suggest_float("lr", 0.1, 0.2)
        raise RuntimeError("broken build")

    with pytest.raises(RuntimeError, match="broken build"):
        nbtrainer.tune(build, n_trials=3, epochs=1, catch=())
    with pytest.raises(TypeError, match="catch must be an exception class or a tuple"):
        nbtrainer.tune(build, n_trials=1, epochs=1, catch="RuntimeError")  # type: ignore[arg-type]

    def bad_value(trial):
        trial.suggest_float("lr", 0.1, 0.2)
        raise ValueError("a bug in build")

    with pytest.raises(ValueError, match="a bug in build"):  # not a training error: said at once
        nbtrainer.tune(bad_value, n_trials=3, epochs=1)
    study = nbtrainer.tune(bad_value, n_trials=2, epochs=1, catch=(ValueError,))
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
