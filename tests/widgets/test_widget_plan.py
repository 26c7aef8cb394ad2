"""The panel's memory plan: Plan for a budget shows the planner's rows as bars; a row click sets the controls and
memory savers, and Start trains with them."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from conftest import needs
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


def test_a_second_plan_closes_the_rows_of_the_first() -> None:
    """Each plan draws its own row buttons and bars; the last plan's are closed (a comm each, for the kernel's life
    otherwise), and closing the panel leaves none of its widgets open."""
    import ipywidgets

    registry = getattr(ipywidgets.Widget, "_active_widgets", None) or ipywidgets.Widget.widgets
    before = set(registry)
    w = _widget()
    _planned(w)
    first = list(w.plan_view.rows.children)
    _planned(w)
    assert first and all(row.comm is None for row in first)
    assert all(row.comm is not None for row in w.plan_view.rows.children)
    made = [x for key, x in list(registry.items()) if key not in before]
    w.close()
    assert not [type(x).__name__ for x in made if x.comm is not None]


def _planned(w: Any, budget_gb: float = 0.004) -> Any:
    pv = w.plan_view
    pv.budget.value = budget_gb
    pv.plan_button.click()
    assert pv.thread is not None
    pv.thread.join(60)
    assert pv.plan is not None, _messages(w, "error")
    return pv.plan


def _wide_panel(data: Any, **kw: Any) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 4)
    )
    return TrainerWidget(
        model, torch.nn.CrossEntropyLoss(), "adamw", data, epochs=1, lr=1e-3, device="cpu", progress=False,
        refresh_interval=0.05, ui_interval=0.05, run_store=False, **kw,
    )  # fmt: skip


def _click(w: Any, row: Any) -> None:
    buttons = [c for c in w.plan_view.rows.children if "nbt-plan-row" in classes(c)]
    buttons[w.plan_view.plan.rows.index(row)].click()


@needs("peft")
def test_a_row_clicked_is_the_row_trained_its_optimizer_lora_rank_and_micro_batch() -> None:
    # the rows said adamw4bit, LoRA r=16 and micro-batch 32 x 2; the panel trained plain AdamW, r=8 adapters and
    # batches of 64 (accumulation 2: half the optimizer steps), while its message said the row was set
    x, y = make_classification(n=512, d=64, classes=4, seed=0)
    w = _wide_panel((x, y), batch_size=64)
    plan = _planned(w)
    kbit = next(r for r in plan.rows if r.memory.optimizer == "adamw4bit")
    _click(w, kbit)
    why = w.savers.reasons.get("optimizer:adamw4bit")
    if why:  # torchao missing: said, and the menu does not pretend
        assert w.savers.optimizer.value == "as given" and any("adamw4bit" in t for t in _messages(w, "warning"))
    else:
        assert w.savers.optimizer.value == "adamw4bit" and w.savers.in_backward.value
    split = next(r for r in plan.rows if r.memory.lora and r.grad_accum_steps == 2 and r.memory.optimizer == "adamw")
    assert split.memory.lora["r"] == 16 and split.micro_batch == 32
    _click(w, split)
    assert w.savers.optimizer.value == "as given" and not w.savers.in_backward.value  # the earlier row's are gone
    assert w.view.accum.value == 2 and next(iter(w.train_loader))[0].shape[0] == 32
    assert _messages(w, "info")[-1].count("memory plan row set: " + split.describe()) == 1
    w.start()
    history = w.wait()
    assert history.status == "finished" and w.trainer.grad_accum_steps == 2
    assert w.trainer.global_step == 512 // 32 // 2  # micro-batches of 32, two per step
    ranks = {p.shape[0] for n, p in w.trainer.model.named_parameters() if "lora_A" in n}
    assert ranks == {16}


def test_a_row_whose_micro_batch_cannot_be_applied_says_so() -> None:
    x, y = make_classification(n=512, d=64, classes=4, seed=0)
    w = _wide_panel(make_loader(x, y, 64))  # a loader given: its batches are not the panel's to change
    plan = _planned(w)
    split = next(r for r in plan.rows if r.grad_accum_steps > 1)
    _click(w, split)
    assert w.view.accum.value == split.grad_accum_steps
    warning = _messages(w, "warning")[-1]
    assert "memory plan row set in part" in warning and f"micro-batch {split.micro_batch}" in warning
    assert not any("memory plan row set:" in t for t in _messages(w, "info"))
    whole = next(r for r in plan.rows if r.grad_accum_steps == 1)
    _click(w, whole)
    assert w.view.accum.value == 1  # a row that does not split the batch sets accumulation back


PLANNING = threading.Event()  # not an attribute: the planner copies the model


class _Planned(torch.nn.Module):
    """The test's MLP, its forward telling when the planner runs it (the plan simulates steps on fake tensors)
    and taking 0.2 s more there, as a bigger model's planning takes seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name == "nbtrainer-plan":
            PLANNING.set()
            time.sleep(0.2)
        return self.inner(x)


def test_closing_the_panel_while_it_plans_waits_for_the_plan_and_draws_nothing() -> None:
    """Before: ``w.close()`` returned while the plan's thread still ran; the plan then drew its rows (new widgets)
    into the closed panel."""
    model = _Planned()
    PLANNING.clear()
    x, y = make_classification(n=256, d=32, seed=0)
    w = TrainerWidget(
        model, torch.nn.CrossEntropyLoss(), "adamw", make_loader(x, y, 128), epochs=1, device="cpu", progress=False,
        run_store=False,
    )  # fmt: skip
    pv = w.plan_view
    pv.budget.value = 1.0
    pv.plan_button.click()
    assert PLANNING.wait(60), f"the plan never ran the model: {_messages(w, 'error')}"
    w.close()
    assert pv.thread is not None and not pv.thread.is_alive()  # waited for
    assert pv.plan is None and pv.rows.children == ()
    assert _messages(w, "error") == []
