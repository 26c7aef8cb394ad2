"""The panel with several named optimizers: one LR readout per optimizer and a target menu for the LR control."""

from __future__ import annotations

from typing import Any

import torch
from widget_helpers import classes, make_classification, make_loader

from nbtrainer import TrainerWidget


def _widget() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opts = {"body": torch.optim.SGD(model[0].parameters(), lr=0.1), "head": torch.optim.AdamW(model[2].parameters())}
    x, y = make_classification(n=64, d=16, seed=0)
    return TrainerWidget(
        model, torch.nn.CrossEntropyLoss(), opts, make_loader(x, y, 16), epochs=1, device="cpu", progress=False,
        refresh_interval=0.05, ui_interval=0.05, run_store=False,
    )  # fmt: skip


def test_each_optimizer_has_its_lr_and_the_control_sets_the_one_chosen() -> None:
    w = _widget()
    v, t = w.view, w.trainer
    assert "nbt-lr-target" in classes(v.lr_target) and v.lr_target.layout.display != "none"
    assert [value for _, value in v.lr_target.options] == ["", "body", "head"]
    assert "body" in v.lr_readout.value and "1.00e-1" in v.lr_readout.value and "1.00e-3" in v.lr_readout.value
    v.lr_target.value = "head"
    assert float(v.lr_exact.value) == 1e-3  # the control shows the chosen optimizer's LR
    v.lr_exact.value = "5e-4"
    assert t.lrs == {"body": 0.1, "head": 5e-4}
    assert "5.00e-4" in v.lr_readout.value
    v.lr_target.value = ""
    v.lr_exact.value = "2e-2"  # "all": each optimizer gets it
    assert t.lrs == {"body": 0.02, "head": 0.02}


def test_one_optimizer_shows_no_target_menu() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 3)
    x, y = make_classification(n=32, d=16, seed=0)
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                      make_loader(x, y, 16), epochs=1, device="cpu", progress=False, run_store=False)  # fmt: skip
    assert w.view.lr_target.layout.display == "none" and w.view.lr_readout.layout.display == "none"
    assert w.trainer.lrs == {}


def _manual_step(step: Any, batch: Any) -> dict[str, torch.Tensor]:
    """The head trains on its loss alone, then the body on a second forward (a GAN's shape, in miniature)."""
    x, y = batch
    head_loss = torch.nn.functional.cross_entropy(step.model(x), y)
    step.backward(head_loss, optimizer="head")
    step.step("head")
    body_loss = torch.nn.functional.cross_entropy(step.model(x), y)
    step.backward(body_loss, optimizer="body")
    step.step("body")
    return {"loss": head_loss, "body_loss": body_loss}


def _validation_step(model: Any, batch: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    return {"loss": torch.nn.functional.cross_entropy(model(x), y)}


def test_a_training_step_runs_in_the_panel_and_its_values_reach_history_table_and_charts() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opts = {"body": torch.optim.SGD(model[0].parameters(), lr=0.1), "head": torch.optim.SGD(model[2].parameters())}
    x, y = make_classification(n=96, d=16, seed=0)
    w = TrainerWidget(
        model, None, opts, make_loader(x, y, 16), make_loader(x[:32], y[:32], 16), epochs=2, device="cpu",
        progress=False, refresh_interval=0.05, ui_interval=0.05, run_store=False,
        training_step=_manual_step, validation_step=_validation_step, grad_accum_steps=2,
    )  # fmt: skip
    w.start()
    h = w.wait()
    assert h.status == "finished" and w.trainer.global_step == 6  # 6 batches an epoch, windows of 2
    assert {"loss", "body_loss", "val_loss"} <= set(h.epochs[-1])
    assert "body_loss" in w.view.epoch_table.value  # a column of the live epoch table
    # the values the step returned are charted: the loss per step, body_loss among the per-epoch metrics
    assert w.charts.sent_points()["loss"] >= 6
    assert "body_loss" in list(w.charts.other_choice.options)
    assert "body" in w.view.lr_readout.value and "head" in w.view.lr_readout.value


def test_choosing_an_optimizer_in_the_target_menu_does_not_move_any_lr_at_start() -> None:
    """Before: with the menu on "head", Start scaled every group of every optimizer by head's LR over body's, so the
    run trained at body 1e-2 -> 1e-3 and head 1e-3 -> 1e-4, unlike the headless fit."""
    w = _widget()
    t = w.trainer
    lrs = dict(t.lrs)
    w.view.lr_target.value = "head"  # only shows head's LR
    w.start()
    history = w.wait()
    assert t.lrs == lrs
    assert {round(lr, 12) for lr in history.steps["lr"]} == {lrs["body"]}  # the logged LR is the first optimizer's


def test_a_set_lr_from_code_between_runs_is_what_the_next_run_trains_at() -> None:
    """Before: Start reset the optimizer to the LR control's value, which a trainer.set_lr() from code had not moved,
    so the run trained at the old LR while the headless fit trained at the new one."""
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 3)
    x, y = make_classification(n=64, d=16, seed=0)
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
                      make_loader(x, y, 16), epochs=1, device="cpu", progress=False, run_store=False)  # fmt: skip
    w.trainer.set_lr(0.02)
    w.start()
    history = w.wait()
    assert set(history.steps["lr"]) == {0.02}
    assert float(w.view.lr_exact.value) == 0.02  # and the control says so
