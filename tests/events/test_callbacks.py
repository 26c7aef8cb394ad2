"""EarlyStopping, ModelCheckpoint, duck-typed callbacks and the event order."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import EVENTS, EarlyStopping, LRMonitor, ModelCheckpoint, Trainer, load_checkpoint
from nbtrainer._events._stream import HOOK_KEYWORDS


class Scripted:
    """Overwrites val_loss with a scripted sequence, so the expected stop epoch is known exactly."""

    def __init__(self, values):
        self.values = list(values)

    def on_epoch_end(self, trainer, epoch, logs):
        logs["val_loss"] = self.values[epoch - 1]


def _trainer(callbacks, **kw):
    model = mlp()
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=callbacks,
        progress=False,
        **kw,
    )


@pytest.mark.parametrize(
    "values,patience,stop_epoch",
    [
        ([1.0, 0.9, 0.95, 0.96, 0.97, 0.5, 0.4], 3, 5),
        ([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4], 2, None),
        ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 1, 2),
    ],
)
def test_early_stopping_stops_at_the_right_epoch(values, patience, stop_epoch):
    x, y = make_classification(n=64)
    es = EarlyStopping("val_loss", patience=patience)
    h = _trainer([Scripted(values), es]).fit(make_loader(x, y), make_loader(x, y), epochs=7)
    assert len(h) == (stop_epoch or 7)
    assert es.stopped_epoch == stop_epoch
    assert h.status == ("stopped" if stop_epoch else "finished")


def test_early_stopping_at_the_last_epoch_is_a_normal_finish():
    # Patience runs out exactly at epoch 5 of 5: every epoch ran, so the run finished, and no stop reason
    # suggests it was cut short; the callback still records where it fired.
    x, y = make_classification(n=64)
    es = EarlyStopping("val_loss", patience=2)
    h = _trainer([Scripted([1.0, 0.9, 0.8, 0.9, 0.9]), es]).fit(make_loader(x, y), make_loader(x, y), epochs=5)
    assert len(h) == 5 and es.stopped_epoch == 5
    assert h.status == "finished" and h.stop_reason is None


def test_early_stopping_non_finite_and_restore_best():
    x, y = make_classification(n=64)
    es = EarlyStopping("val_loss", patience=5, restore_best_weights=True)
    trainer = _trainer([Scripted([1.0, 0.5, 0.7, float("nan"), 0.1]), es])
    snapshots = []
    trainer.add_callback(
        type(
            "Snap",
            (),
            {
                "on_epoch_end": lambda self, trainer, epoch, logs: snapshots.append(
                    {k: v.clone() for k, v in trainer.model.state_dict().items()}
                )
            },
        )()
    )
    h = trainer.fit(make_loader(x, y), make_loader(x, y), epochs=5)
    assert len(h) == 4 and "nan" in h.stop_reason
    best = snapshots[1]  # epoch 2 had the best val_loss
    assert all(torch.equal(v, best[k]) for k, v in trainer.model.state_dict().items())


def test_monitoring_a_key_that_never_exists_fails_before_training(tmp_path):
    x, y = make_classification(n=64)
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=[EarlyStopping("val_loss")],
        progress=False,
    )
    with pytest.raises(ValueError, match="no val_loader was given"):
        trainer.fit(make_loader(x, y), epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    ck = ModelCheckpoint(tmp_path / "ck", monitor="val_accuracy")
    with pytest.raises(ValueError, match="val_accuracy"):
        _trainer([ck]).fit(make_loader(x, y), make_loader(x, y), epochs=2)
    assert not any(p.suffix == ".ckpt" for p in (tmp_path / "ck").glob("*"))


def test_model_checkpoint_top_k_and_last(tmp_path):
    x, y = make_classification(n=64)
    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=2, save_last=True)
    scripted = Scripted([0.9, 0.5, 0.7, 0.3, 0.8])
    trainer = _trainer([scripted, ck])
    trainer.fit(make_loader(x, y), make_loader(x, y), epochs=5)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["epoch002-0.5000.ckpt", "epoch004-0.3000.ckpt", "last.ckpt"]
    assert ck.best_model_path is not None and ck.best_model_path.endswith("epoch004-0.3000.ckpt")
    last = load_checkpoint(tmp_path / "last.ckpt")
    assert len(last["history"]["epochs"]) == 5 and last["loop"]["global_step"] == trainer.global_step
    best = load_checkpoint(ck.best_model_path)
    assert best["history"]["epochs"][-1]["val_loss"] == 0.3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


class ScriptedWhenValidated:
    """Overwrites val_loss with a scripted sequence on the epochs that validate, and only on those."""

    def __init__(self, values):
        self.values = list(values)

    def on_epoch_end(self, trainer, epoch, logs):
        if "val_loss" in logs:
            logs["val_loss"] = self.values.pop(0)


def test_early_stopping_skips_epochs_without_validation():
    # val_every_n_epochs=2: epochs 1, 3, 5 log no val_loss. They are not judged (it used to be a KeyError at the
    # end of epoch 1, after training) and do not count in the patience: 1.0 at epoch 2, then no improvement at 4.
    x, y = make_classification(n=64)
    es = EarlyStopping("val_loss", patience=1)
    trainer = _trainer([ScriptedWhenValidated([1.0, 1.1, 0.5]), es], val_every_n_epochs=2)
    h = trainer.fit(make_loader(x, y), make_loader(x, y), epochs=6)
    assert [("val_loss" in row) for row in h.epochs] == [False, True, False, True]
    assert es.stopped_epoch == 4 and es.best_epoch == 2 and es.wait == 1
    assert h.status == "stopped" and "did not improve for 1 epochs" in h.stop_reason


def test_a_fit_shorter_than_val_every_n_epochs_refuses_a_val_monitor_up_front(tmp_path):
    # epochs=2 with val_every_n_epochs=3 never validates: monitoring val_loss is refused before the first step
    # (the monitors skip epochs without it, so it would otherwise never be fed), and a plateau watches loss.
    x, y = make_classification(n=64)
    trainer = _trainer([EarlyStopping("val_loss")], val_every_n_epochs=3)
    with pytest.raises(ValueError, match=r"never log \(no val_loader was given to fit\(\), or val_every_n_epochs=3 is"):
        trainer.fit(make_loader(x, y), make_loader(x, y), epochs=2)
    assert trainer.global_step == 0
    assert trainer.fit(make_loader(x, y), make_loader(x, y), epochs=3).epochs[-1]["val_loss"] > 0


def test_model_checkpoint_ranks_only_the_epochs_that_log_its_keys(tmp_path):
    # The monitor, and a filename naming a val_ key without a monitor: the epochs without validation write no
    # ranked file (their name and score do not exist), last.ckpt is still written every epoch.
    x, y = make_classification(n=64)
    ranked = ModelCheckpoint(tmp_path / "ranked", monitor="val_loss", save_top_k=-1, save_last=True)
    named = ModelCheckpoint(tmp_path / "named", filename="e{epoch}-{val_loss:.1f}", save_top_k=-1)
    trainer = _trainer([ScriptedWhenValidated([0.5, 0.25]), ranked, named], val_every_n_epochs=2)
    h = trainer.fit(make_loader(x, y), make_loader(x, y), epochs=4)
    assert h.status == "finished" and len(h) == 4
    assert sorted(p.name for p in (tmp_path / "ranked").iterdir()) == [
        "epoch002-0.5000.ckpt",
        "epoch004-0.2500.ckpt",
        "last.ckpt",
    ]
    assert ranked.best_model_path is not None and ranked.best_model_path.endswith("epoch004-0.2500.ckpt")
    assert load_checkpoint(tmp_path / "ranked" / "last.ckpt")["loop"]["global_step"] == trainer.global_step
    assert sorted(p.name for p in (tmp_path / "named").iterdir()) == ["e2-0.5.ckpt", "e4-0.2.ckpt"]


def test_checkpoint_roundtrip_restores_weights(tmp_path):
    x, y = make_classification(n=64)
    trainer = _trainer([])
    trainer.fit(make_loader(x, y), epochs=2)
    path = trainer.save_checkpoint(str(tmp_path / "a.ckpt"))
    other = _trainer([])
    other.load_state_dict(load_checkpoint(path))
    for a, b in zip(trainer.model.parameters(), other.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert other.history.epochs == trainer.history.epochs


def test_event_order_and_duck_typing():
    seen: list[tuple[Any, ...]] = []

    class Partial:  # defines only two hooks: the others are never looked up
        def on_epoch_start(self, trainer, epoch):
            seen.append(("epoch_start", epoch))

        def on_fit_end(self, trainer, history):
            seen.append(("fit_end", history.status))

    class All:
        def __getattr__(self, name):
            if name in EVENTS:
                return lambda **kw: seen.append((name,))
            raise AttributeError(name)

    x, y = make_classification(n=64)
    _trainer([Partial(), All(), LRMonitor()]).fit(make_loader(x, y, batch_size=32), make_loader(x, y), epochs=1)
    names = [s[0] for s in seen]
    assert names[0] == "on_fit_start" and names[-2:] == ["fit_end", "on_fit_end"] and ("epoch_start", 1) in seen
    order = [
        n
        for n in names
        if n
        in (
            "on_train_batch_start",
            "on_train_batch_end",
            "on_before_optimizer_step",
            "on_optimizer_step",
            "on_validation_start",
            "on_validation_end",
            "on_epoch_end",
        )
    ]
    assert order == [
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_optimizer_step",
        "on_optimizer_step",
    ] * 2 + ["on_validation_start", "on_validation_end", "on_epoch_end"]


class _MetricsNotLogs:
    def on_epoch_end(self, trainer, epoch, metrics):  # nbtrainer passes logs=
        pass


def test_a_hook_that_cannot_take_its_keywords_is_refused_before_training():
    """Once accepted, then a TypeError "unexpected keyword argument 'logs'" after a whole epoch trained."""
    with pytest.raises(TypeError) as err:
        _trainer([_MetricsNotLogs()])
    message = str(err.value)
    for part in (
        "Callback _MetricsNotLogs",
        "on_epoch_end(trainer, epoch, metrics)",
        "trainer=, epoch=, logs=",
        "no parameter 'logs'",
        "'metrics' would get no value",
        "(self, trainer, epoch, logs)",
        "**kwargs",
    ):
        assert part in message, f"{part!r} not in: {message}"
    trainer = _trainer([])
    with pytest.raises(TypeError, match="Callback _MetricsNotLogs defines on_epoch_end"):
        trainer.add_callback(_MetricsNotLogs())
    assert not any(isinstance(cb, _MetricsNotLogs) for cb in trainer.callbacks.callbacks)


class _Flexible:
    def on_fit_start(self, trainer, verbose=False):  # an extra parameter with a default
        pass

    def on_epoch_end(self, trainer, **kwargs):
        pass

    def on_optimizer_step(self, **_):
        pass


class _Strict:
    """Every hook takes exactly its HOOK_KEYWORDS, keyword-only: a keyword the loop passes and the table does not
    list (or the other way round) fails the fit."""

    def __init__(self):
        self.seen: list[str] = []
        for name, keywords in HOOK_KEYWORDS.items():
            namespace: dict[str, Any] = {}
            exec(f"def hook(*, {', '.join(keywords)}): seen.append({name!r})", {"seen": self.seen}, namespace)
            setattr(self, name, namespace["hook"])


def test_hooks_taking_the_documented_keywords_are_accepted_and_called():
    assert set(HOOK_KEYWORDS) == set(EVENTS)
    strict = _Strict()
    x, y = make_classification(n=64)

    class Control:
        def on_epoch_start(self, trainer, epoch):
            trainer.set_lr(0.01)  # an on_control event
            if epoch == 2:
                raise RuntimeError("stop here")  # on_exception

    trainer = _trainer([_Flexible(), strict, Control()])
    with pytest.raises(RuntimeError, match="stop here"):
        trainer.fit(make_loader(x, y, batch_size=32), make_loader(x, y), epochs=2)
    never = {"on_health"}  # fires only on a Health finding, which this healthy fit never has
    assert set(strict.seen) == set(EVENTS) - never


def test_lr_monitor_agrees_with_the_lr_column_under_an_epoch_scheduler():
    x, y = make_classification(n=64)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1),
        scheduler_interval="epoch",
        callbacks=[LRMonitor()],
        progress=False,
    )
    history = trainer.fit(make_loader(x, y, batch_size=16), epochs=3)
    assert history["lr"] == pytest.approx([0.1, 0.01, 0.001])  # the LR each epoch trained with
    assert history["lr_group0"] == history["lr"]
    assert trainer.current_lr == pytest.approx(1e-4)  # the schedule still stepped after every epoch


class SaveAt:
    """Writes a checkpoint after one optimizer step, as a run killed right after it would have left one."""

    def __init__(self, step, path):
        self.step, self.path = step, path

    def on_optimizer_step(self, trainer, step, skipped):
        if step == self.step:
            trainer.save_checkpoint(self.path)


def _two_group_trainer(callbacks):
    model = mlp()
    opt = torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters(), "lr": 0.01}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, scheduler=sched, callbacks=callbacks, progress=False)


def test_epoch_lr_is_what_the_last_step_used_under_a_per_step_scheduler(tmp_path):
    # 4 steps per epoch, LR = base / (1 + step): epoch 1's last step used base / 4, epoch 2's base / 8. The row and
    # LRMonitor used to show the LR after the scheduler's last step (base / 5, base / 9): the next epoch's first.
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)
    trainer = _two_group_trainer([LRMonitor(), SaveAt(4, str(tmp_path / "step4.ckpt"))])
    history = trainer.fit(loader, epochs=2)
    assert history["lr"] == pytest.approx([0.1 / 4, 0.1 / 8])
    assert history.steps["lr"][3] == history["lr"][0] and history.steps["lr"][7] == history["lr"][1]
    assert history["lr_group0"] == history["lr"] and history["lr_group1"] == pytest.approx([0.01 / 4, 0.01 / 8])
    assert trainer.current_lr == pytest.approx(0.1 / 9)  # the schedule itself did step after the last step
    # resumed between epoch 1's last step and its row: the row still names the LR that step used
    resumed = _two_group_trainer([LRMonitor()]).fit(loader, epochs=2, resume_from=str(tmp_path / "step4.ckpt"))
    assert resumed["lr"] == history["lr"] and resumed["lr_group1"] == history["lr_group1"]


def test_train_digits_example_says_why_it_fails(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--epochs", "1", "--lr", "1e-6"]) == 1  # too little training to reach the target
    err = capsys.readouterr().err
    assert "below the target 0.95" in err, err


class Snapshots:
    """The model's weights at the end of each epoch."""

    def __init__(self):
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.weights.append({k: v.clone() for k, v in trainer.model.state_dict().items()})


def _weights_are(trainer, weights):
    return all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())


def test_a_fresh_fit_starts_early_stopping_over_and_fit_more_continues_it():
    x, y = make_classification(n=64)
    loader = make_loader(x, y)
    es = EarlyStopping("val_loss", patience=3, restore_best_weights=True)
    scripted, snaps = Scripted([0.1, 0.2, 0.3, 0.4]), Snapshots()
    trainer = _trainer([scripted, es, snaps])
    first = trainer.fit(loader, loader, epochs=6)
    assert len(first) == 4 and es.best_epoch == 1 and _weights_are(trainer, snaps.weights[0])
    # A second fit (not a resume): its own best, its own patience, its own weights restored. It used to stop at
    # once against the first fit's best (0.1) and load the first fit's weights over the new model.
    scripted.values, snaps.weights = [0.5, 0.4, 0.45, 0.42], []
    second = trainer.fit(loader, loader, epochs=4)
    assert len(second) == 4 and second.status == "finished" and es.stopped_epoch is None
    assert es.best == 0.4 and es.best_epoch == 2 and _weights_are(trainer, snaps.weights[1])
    # fit_more continues the run: the best and the patience count carry on (epoch 5 is the third without a gain)
    scripted.values += [0.41, 0.43]
    more = trainer.fit_more(loader, loader, epochs=2)
    assert len(more) == 5 and more.status == "stopped" and es.stopped_epoch == 5 and es.best_epoch == 2
    assert _weights_are(trainer, snaps.weights[1])


def test_a_fresh_fit_starts_model_checkpoint_over_a_resume_and_fit_more_continue_it(tmp_path):
    x, y = make_classification(n=64)
    loader = make_loader(x, y)
    ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=1, save_last=True)
    scripted = Scripted([0.1, 0.2])
    trainer = _trainer([scripted, ck])
    trainer.fit(loader, loader, epochs=2)
    first_best = ck.best_model_path
    assert first_best is not None and first_best.endswith("epoch001-0.1000.ckpt")
    # a second fit ranks its own epochs: its best is 0.4, not the first fit's 0.1 (kept as best_model_path before)
    scripted.values = [0.5, 0.4]
    second = trainer.fit(loader, loader, epochs=2)
    assert ck.best_model_path is not None and ck.best_model_path.endswith("epoch002-0.4000.ckpt")
    assert [score for score, _ in ck.best_k] == [0.4]
    assert load_checkpoint(ck.best_model_path)["history"]["epochs"][-1]["val_loss"] == second["val_loss"][-1] == 0.4
    # the first fit's file is left where it was (only this fit's own top-k files are replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch001-0.1000.ckpt", "epoch002-0.4000.ckpt", "last.ckpt"]
    # a resume (from the second fit's last.ckpt) and fit_more continue the ranking: a worse epoch keeps the best
    resumed_ck = ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=1, save_last=True)
    resumed = _trainer([Scripted([0.5, 0.4, 0.45]), resumed_ck])
    resumed.fit(loader, loader, epochs=3, resume_from="last")
    assert resumed_ck.best_model_path == ck.best_model_path and [s for s, _ in resumed_ck.best_k] == [0.4]
    scripted.values += [0.45]
    trainer.fit_more(loader, loader, epochs=1)
    assert ck.best_model_path.endswith("epoch002-0.4000.ckpt") and [s for s, _ in ck.best_k] == [0.4]


@pytest.mark.parametrize(
    "values,threshold,stop_epoch",
    [
        ([0.8, 0.58, 0.56, 0.55, 0.54, 0.53], {"stopping_threshold": 0.5}, None),  # never reaches 0.5
        ([0.8, 0.55, 0.5, 0.4], {"stopping_threshold": 0.5}, 3),  # reaches it, though no gain of min_delta
        ([0.4, 0.45, 0.55, 0.58], {"divergence_threshold": 0.5}, 3),  # worse than 0.5, by less than min_delta
        ([0.4, 0.45, 0.5, 0.45], {"divergence_threshold": 0.5}, None),  # 0.5 itself is not worse
    ],
)
def test_early_stopping_thresholds_compare_the_raw_value_not_shifted_by_min_delta(values, threshold, stop_epoch):
    # min_delta says what counts as an improvement, not where the thresholds lie: with min_delta=0.1 the thresholds
    # acted at 0.4 and 0.6 instead of 0.5 (a run stopped at 0.58 as if it had "reached" 0.5)
    x, y = make_classification(n=64)
    es = EarlyStopping("val_loss", patience=10, min_delta=0.1, **threshold)
    h = _trainer([Scripted(values), es]).fit(make_loader(x, y), make_loader(x, y), epochs=len(values))
    assert es.stopped_epoch == stop_epoch and len(h) == (stop_epoch or len(values))
    if stop_epoch is not None:
        assert "threshold=0.5" in h.stop_reason


@pytest.mark.parametrize("save_top_k", [-2, -10, 1.5, True])
def test_model_checkpoint_refuses_a_save_top_k_below_minus_one(save_top_k, tmp_path):
    # -2 (a typo for -1 or 2) used to keep every checkpoint, as -1 does
    with pytest.raises(ValueError, match=r"save_top_k must be an int: -1 \(keep all\), 0 .* or k >= 1"):
        ModelCheckpoint(tmp_path, monitor="val_loss", save_top_k=save_top_k)
