"""Schedulers: one step per optimizer step (OneCycle total_steps exact), never when fp16 skipped it."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer


@pytest.mark.parametrize("accum,n,bs", [(1, 256, 32), (3, 256, 32), (4, 250, 32)])
def test_onecycle_steps_equal_total_steps(accum, n, bs):
    x, y = make_classification(n=n)
    loader = make_loader(x, y, batch_size=bs)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, grad_accum_steps=accum, progress=False)
    total = trainer.total_steps(loader, epochs=3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total)
    trainer.set_scheduler(sched)
    history = trainer.fit(loader, epochs=3)  # OneCycleLR raises if stepped past total_steps
    assert sched.last_epoch == total == trainer.global_step
    assert len(history.steps["lr"]) == total
    # The recorded per-step LR is the schedule: warm-up then anneal, peak at max_lr.
    lrs = history.steps["lr"]
    assert max(lrs) == pytest.approx(0.1, rel=0.05) and lrs[0] < 0.01 and lrs[-1] < 1e-3


@pytest.mark.parametrize("interval", ["step", "epoch"])
def test_a_onecycle_longer_than_the_fit_is_said_before_the_first_step(interval):
    """total_steps=len(loader) * epochs under grad_accum_steps=3 (Lightning's and a hand loop's count, which forgets
    the accumulation), or a per-step count stepped once per epoch: the fit ended with the LR near its peak, never
    annealed, and nothing said so (a schedule too short was already refused)."""
    x, y = make_classification(n=70)
    loader = make_loader(x, y, batch_size=10)  # 7 batches: windows of 3, 3 and 1, 3 optimizer steps an epoch
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, grad_accum_steps=3, progress=False)
    total = len(loader) * 2 if interval == "step" else trainer.total_steps(loader, 2)
    trainer.set_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=total), interval)
    steps = "6 optimizer steps" if interval == "step" else "2 epochs"
    with pytest.warns(UserWarning, match=rf"OneCycleLR was built for total_steps={total} but this fit .*{steps}") as w:
        history = trainer.fit(loader, epochs=2)
    assert w[0].filename == __file__  # points at the fit() call
    assert "trainer.total_steps(train_loader, epochs)" in str(w[0].message)
    assert history.steps["lr"][-1] > 0.01  # what it warned of: the LR ended far from its annealed end

    exact = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=trainer.total_steps(loader, 2))
    trainer.set_scheduler(exact, "step")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer.fit(loader, epochs=2)  # sized for the fit: nothing to say
        trainer.set_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100), "step")
        trainer.fit(loader, epochs=2, max_steps=4)  # a fit cut short on purpose: nothing to say either


def test_epoch_interval_and_plateau():
    x, y = make_classification(n=128)
    loader = make_loader(x, y)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step_lr = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), opt, scheduler=step_lr, scheduler_interval="epoch", progress=False
    )
    h = trainer.fit(loader, epochs=3)
    assert h["lr"] == pytest.approx([0.1, 0.05, 0.025])

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # threshold=1.0 (rel): only a 100% improvement counts, so every epoch after the first is a plateau.
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=1.0)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, scheduler=plateau, progress=False)
    h = trainer.fit(loader, make_loader(x, y), epochs=3)  # default interval "step": plateau still per epoch
    assert h["lr"] == pytest.approx([0.1, 0.05, 0.025])  # reduced on val_loss, once per epoch


class RecordedPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau, keeping the values it was stepped on."""

    def __init__(self, *args, **kwargs):
        self.fed: list[float] = []
        super().__init__(*args, **kwargs)

    def step(self, metrics, epoch=None):  # type: ignore[override]  # torch's own step overrides LRScheduler's so
        self.fed.append(float(metrics))
        super().step(metrics, epoch)


@pytest.mark.parametrize("monitor", [None, "val_loss"])
def test_plateau_watches_one_key_and_skips_epochs_without_validation(monitor):
    # val_every_n_epochs=2: the default monitor is val_loss for the whole fit (it used to be the train loss on
    # epochs 1 and 3 and val_loss on 2 and 4, one plateau tracker comparing both); scheduler_monitor="val_loss"
    # used to raise KeyError at the end of epoch 1. Epochs without validation do not step the plateau.
    x, y = make_classification(n=128)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = RecordedPlateau(opt, patience=0, factor=0.5, threshold=1.0)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        scheduler=plateau,
        scheduler_monitor=monitor,
        val_every_n_epochs=2,
        progress=False,
    )
    h = trainer.fit(make_loader(x, y), make_loader(x, y), epochs=4)
    assert plateau.fed == [h.epochs[1]["val_loss"], h.epochs[3]["val_loss"]]
    # threshold=1.0: every step is a plateau, so a cut after epochs 2 and 4 only (the rows: the LR each trained with)
    assert h["lr"] == pytest.approx([0.1, 0.1, 0.05, 0.05]) and trainer.current_lr == pytest.approx(0.025)


def test_scheduler_not_stepped_when_fp16_skips():
    x, y = make_classification(n=256)
    loader = make_loader(x, y)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, scheduler=sched, precision="fp16-mixed", progress=False)
    # A huge initial scale overflows fp16 grads: the scaler skips steps and backs off.
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    history = trainer.fit(loader, epochs=2)
    skipped = history.last["skipped_steps"]
    assert skipped > 0
    assert sched.last_epoch == trainer.global_step - skipped


def _sequential(opt):
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.5, end_factor=1.0, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])


def _chained(opt):
    return torch.optim.lr_scheduler.ChainedScheduler(
        [
            torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
            torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, eta_min=0.02),
        ]
    )


def _cyclic(opt):
    return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=4, cycle_momentum=False)


class SetLRAfter:
    """``trainer.set_lr(reference * factor)`` after the first optimizer step (applied from the second on)."""

    def __init__(self, factor):
        self.factor = factor

    def on_optimizer_step(self, trainer, step, skipped):
        if step == 1:
            trainer.set_lr(trainer.lr * self.factor)


@pytest.mark.parametrize("make", [_sequential, _chained, _cyclic], ids=["sequential", "chained", "cyclic"])
def test_set_lr_rescales_the_whole_schedule(make):
    # torch's own schedule, unchanged, then the same fit with set_lr(reference / 10) after step 1: from step 2 on
    # every LR is torch's times 0.1. The children of SequentialLR / ChainedScheduler kept their base LRs (the LR
    # jumped back to the old scale at the milestone), and CyclicLR its max_lrs.
    steps = 16
    reference = torch.optim.SGD(mlp().parameters(), lr=0.1)
    sched = make(reference)
    expected = []
    for _ in range(steps):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        sched.step()
    expected = expected[:1] + [lr * 0.1 for lr in expected[1:]]
    x, y = make_classification(n=16 * steps)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), opt, scheduler=make(opt), callbacks=[SetLRAfter(0.1)], progress=False
    )
    h = trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    assert h.steps["lr"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("schedule", ["none", "onecycle", "step"])
def test_the_lr_set_is_the_lr_asked_for_to_the_last_bit(schedule: str) -> None:
    """Before: each set_lr multiplied by new / old, so 3e-3 typed after 0.02595... and 1.7475e-07 was kept (and logged)
    as 0.0029999999999999996."""
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=3e-3)
    trainer = Trainer(model, torch.nn.MSELoss(), opt, progress=False)
    if schedule == "onecycle":
        trainer.set_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=10), "step")
    elif schedule == "step":
        trainer.set_scheduler(torch.optim.lr_scheduler.StepLR(opt, step_size=1), "epoch")
    for lr in (0.025950242113997487, 1.7475284000076842e-07, 3e-3):
        trainer.set_lr(lr)
        assert trainer.lr == lr
    if schedule == "none":
        assert opt.param_groups[0]["lr"] == 3e-3
