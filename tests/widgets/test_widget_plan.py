"""The panel's memory plan: Plan for a budget shows the planner's rows as bars; a row click sets the controls and
memory savers, and Start trains with them."""

from __future__ import annotations

from typing import Any

import torch
from widget_helpers import classes, make_classification, make_loader

from nbtrainer import TrainerWidget, plan_memory


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(3)]
    return torch.nn.Sequential(torch.nn.Linear(32, 64), *blocks, torch.nn.Linear(64, 3))


def _widget() -> Any:
    model = _model()
    x, y = make_classification(n=256, d=32, seed=0)
    return TrainerWidget(
        model, torch.nn.CrossEntropyLoss(), "adamw", make_loader(x, y, 128), epochs=1, lr=1e-3, device="cpu",
        progress=False, refresh_interval=0.05, ui_interval=0.05, run_store=False,
    )  # fmt: skip


def _messages(w: Any, level: str) -> list[str]:
    return [m.value for m in w.view.messages_log.lines.children if f"nbt-message-{level}" in m._dom_classes]


def test_plan_shows_the_planners_rows_and_a_click_sets_the_controls() -> None:
    w = _widget()
    pv = w.plan_view
    assert "nbt-plan-view" in classes(pv.root) and pv.root in w.view.controls.children
    x, y = next(iter(w.train_loader))
    reference = plan_memory(_model(), (x, y), budget_gb=1, device="cpu", criterion=torch.nn.CrossEntropyLoss())
    fp32 = reference.predict(optimizer="adamw").peak_bytes
    pv.budget.value = 0.8 * fp32 / 2**30 / 0.9  # plain fp32 does not fit: the plan switches something on
    pv.plan_button.click()
    assert pv.thread is not None
    pv.thread.join(60)
    plan = pv.plan
    assert plan is not None and plan.best is not None, _messages(w, "error")
    rows = [c for c in pv.rows.children if "nbt-plan-row" in classes(c)]
    bars = [c for c in pv.rows.children if "nbt-plan-bar" in getattr(c, "value", "")]
    assert len(rows) == len(bars) == len(plan.rows)
    best = [r for r in rows if "nbt-plan-best" in classes(r)]
    assert len(best) == 1 and plan.best.describe() in best[0].description
    assert "best:" in pv.note.value and pv.section.is_open
    # the best row, clicked: the controls and savers say what it switches on
    best[0].click()
    m = plan.best.memory
    assert w.view.precision.value == m.precision
    assert w.view.checkpointing.value == bool(m.activation_checkpointing)
    assert w.savers.in_backward.value == m.optimizer_in_backward
    if m.optimizer not in (None, "adamw"):
        assert w.savers.optimizer.value == m.optimizer
    assert any("memory plan row set" in t for t in _messages(w, "info"))


def test_a_budget_nothing_fits_says_so_and_sets_nothing() -> None:
    w = _widget()
    pv = w.plan_view
    pv.budget.value = 0.0001
    pv.plan_button.click()
    assert pv.thread is not None
    pv.thread.join(60)
    assert pv.plan is not None and pv.plan.best is None
    assert "nothing fits" in pv.note.value
    assert not [c for c in pv.rows.children if "nbt-plan-best" in classes(c)]
