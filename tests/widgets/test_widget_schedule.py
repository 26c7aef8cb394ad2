"""The schedule menu's "keep <your scheduler>" after a run on one of the menu's schedules: the user's scheduler
goes on from where it was, at the LR the control shows."""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import TrainerWidget


def _panel(make_scheduler):
    x, y = make_classification(n=256)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        make_loader(x, y, 16),
        epochs=1,
        scheduler=make_scheduler(opt),
        progress=False,
        ui_interval=0.05,
    )


def test_keep_after_a_cosine_run_trains_at_the_lr_the_control_shows():
    w = _panel(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1000))
    assert w.view.scheduler.value == "keep"
    w.start()
    assert w.wait().steps["lr"] == pytest.approx([0.05] * 16)
    w.view.scheduler.value = "cosine"
    w.start()
    assert w.wait().steps["lr"][-1] < 1e-3  # the cosine ran down to about 0
    w.view.scheduler.value = "keep"
    w.start()
    lrs = w.wait().steps["lr"]
    assert w.view.lr.value == pytest.approx(0.05)
    assert lrs == pytest.approx([0.05] * 16), "the StepLR run trained at the LR the cosine schedule left"
    w.view.scheduler.value = "cosine"
    w.start()
    w.wait()
    w.view.lr.value = 0.1  # between runs: the control's LR is the next run's, whichever schedule it picks
    w.view.scheduler.value = "keep"
    w.start()
    assert w.wait().steps["lr"] == pytest.approx([0.1] * 16) and w.view.lr.value == pytest.approx(0.1)


def test_keep_onecycle_after_a_constant_run_goes_on_with_its_schedule():
    w = _panel(lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=100))
    w.start()
    w.wait()
    w.view.scheduler.value = "constant"
    w.start()
    assert w.wait().steps["lr"] == pytest.approx([0.05] * 16)
    w.view.scheduler.value = "keep"
    w.start()
    h = w.wait()  # KeyError 'initial_lr': the constant run had taken the OneCycleLR's keys off the groups
    reference = torch.optim.lr_scheduler.OneCycleLR(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05), max_lr=0.05, total_steps=100
    )
    expected = []
    for _ in range(16):  # the first run's steps
        reference.optimizer.step()
        reference.step()
    for _ in range(16):
        expected.append(reference.get_last_lr()[0])
        reference.optimizer.step()
        reference.step()
    assert h.status == "finished" and h.steps["lr"] == pytest.approx(expected)
    assert w.view.lr.value == pytest.approx(0.05) and w.view.lr.description == "max LR"
