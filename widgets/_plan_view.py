"""The panel's memory plan: a budget, a Plan button, each row of :func:`nbtrainer.plan_memory` as a stacked bar; a
click on a row sets the panel's controls (precision, checkpointing, accumulation) and memory savers before Start.

Planning runs in a helper thread (an 8B decoder takes seconds; the kernel stays free). What the view needs from the
panel is :class:`PlanHost`; it reads only public names of the core.
"""

from __future__ import annotations

import html
import logging
import threading
from typing import Any, Protocol

import ipywidgets as W

from nbtrainer import Trainer, start_training_thread
from nbtrainer.profile import PART_COLORS, MemoryPlan, PlanRow, example_batch, plan_memory

from ._savers import AS_GIVEN, Savers
from ._section import Section
from ._theme import FG2
from ._view import PanelView

__all__ = ["PlanHost", "PlanView"]

log = logging.getLogger(__name__)


class PlanHost(Protocol):
    """What the plan view needs from the panel that owns it (``TrainerWidget`` implements it)."""

    @property
    def trainer(self) -> Trainer: ...

    @property
    def train_loader(self) -> Any: ...

    @property
    def running(self) -> bool: ...

    def notify(self, level: str, text: str, details: str | None = None) -> None: ...


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


class PlanView:
    """The "memory plan" section (class ``nbt-plan-view``): ``budget`` (``nbt-plan-budget``), ``plan_button``
    (``nbt-plan-button``), one button per row (``nbt-plan-row``; the best also ``nbt-plan-best``) above its bar.

    Example:
        >>> pv = PlanView(w, model=model, view=w.view, savers=w.savers)  # doctest: +SKIP
        >>> pv.budget.value = 16; pv.plan_button.click(); pv.thread.join(); pv.choose(pv.plan.best)  # doctest: +SKIP
    """

    def __init__(self, host: PlanHost, *, model: Any, view: PanelView, savers: Savers) -> None:
        self.host, self.model, self.view, self.savers = host, model, view, savers
        self.budget = W.BoundedFloatText(
            value=16.0, min=0.0001, max=100000.0, step=1.0, description="budget GiB", layout=W.Layout(width="190px")
        )
        self.budget.add_class("nbt-plan-budget")
        self.plan_button = W.Button(description="Plan", tooltip="plan_memory for the first batch on this device")
        self.plan_button.add_class("nbt-plan-button")
        self.note = W.HTML()
        self.note.add_class("nbt-plan-note")
        self.rows = W.VBox()
        self.rows.add_class("nbt-plan-rows")
        self.section = Section("memory plan", "nbt-plan-view", closable=False)
        self.section.show(
            W.HBox([self.budget, self.plan_button], layout=W.Layout(align_items="center")),
            self.note,
            self.rows,
            detail="which switches fit, before Start",
            is_open=False,
        )
        self.root = self.section.root
        self.plan: MemoryPlan | None = None
        self.thread: threading.Thread | None = None
        self.plan_button.on_click(lambda _: self.start())

    def start(self) -> None:
        """Plan in a helper thread for the budget typed (refused while a run is alive)."""
        if self.host.running:
            self.host.notify("warning", "planning runs before Start: stop the run first")
            return
        if self.thread is not None and self.thread.is_alive():
            return
        self.plan_button.disabled = True
        self.note.value = f"<span style='color:{FG2}'>planning...</span>"
        # start_training_thread: planning runs torch ops (on the meta device), so an interpreter that exits while it
        # plans waits for it (bounded) instead of aborting mid-op ("terminate called"), and it plans at full speed
        self.thread = start_training_thread(self._plan, args=(float(self.budget.value),), name="nbtrainer-plan")

    def _plan(self, budget_gb: float) -> None:
        trainer = self.host.trainer
        try:
            batch = example_batch(self.host.train_loader)
            plan = plan_memory(
                self.model, batch, budget_gb=budget_gb, device=trainer.device, criterion=trainer.criterion
            )
        except Exception as exc:  # the planner's message says what is wrong and the fix
            log.debug("the memory plan failed: its message is shown in the panel", exc_info=True)
            self.note.value = ""
            self.host.notify("error", f"memory plan: {exc}")
            return
        finally:
            self.plan_button.disabled = False
        self.show(plan)

    def show(self, plan: MemoryPlan) -> None:
        """The plan's rows as buttons over stacked bars, against the budget line."""
        self.plan = plan
        top = max([plan.budget_bytes, *(r.peak_bytes for r in plan.rows)]) * 1.05
        children: list[Any] = []
        for row in plan.rows:
            label = f"{row.time_factor:.2f}x · {_gib(row.peak_bytes)} · {row.describe()}"
            if row.changes_training:
                label += " (changes what trains)"
            button = W.Button(description=label, tooltip=label, layout=W.Layout(width="auto", max_width="100%"))
            button.add_class("nbt-plan-row")
            if row is plan.best:
                button.add_class("nbt-plan-best")
                button.button_style = "success"
            if not row.fits:
                button.add_class("nbt-plan-over")
            button.on_click(lambda _, row=row: self.choose(row))
            children += [button, W.HTML(_bar(row, plan, top))]
        self.rows.children = tuple(children)
        best = plan.best.describe() if plan.best is not None else "nothing fits: smaller batch, LoRA or a bigger device"
        self.note.value = (
            f"<span style='color:{FG2}'>{html.escape(plan.device)}, batch {plan.batch_size}, "
            f"planned in {plan.seconds:.1f} s; best: <b>{html.escape(best)}</b>. Click a row to set the controls."
            "</span>"
        )
        self.section.set_open(True)

    def choose(self, row: PlanRow) -> None:
        """Set the panel's controls and memory savers to ``row`` (applied at Start)."""
        if self.host.running:
            self.host.notify("warning", "a plan row is applied before Start: stop the run first")
            return
        m, view, savers = row.memory, self.view, self.savers
        said: list[str] = []
        if view.precision.value != m.precision:
            view.precision.value = m.precision
        if bool(view.checkpointing.value) != bool(m.activation_checkpointing):
            view.checkpointing.value = bool(m.activation_checkpointing)
        kind = m.optimizer if m.optimizer not in (None, "adamw") else AS_GIVEN
        options = [value for _, value in savers.optimizer.options]
        savers.optimizer.value = kind if kind in options else AS_GIVEN
        savers.in_backward.value = bool(m.optimizer_in_backward)
        savers.offload_activations.value = bool(m.offload_activations)
        savers.offload_optimizer.value = bool(m.offload_optimizer)
        savers.quantize.value = m.quantize or "none"
        savers.lora.value = m.lora is not None
        if row.grad_accum_steps > 1:
            view.accum.value = row.grad_accum_steps
            said.append(
                f"the plan splits each batch of {row.micro_batch * row.grad_accum_steps} into {row.grad_accum_steps}:"
                f" accumulation is set to {row.grad_accum_steps}; give the loader batch_size={row.micro_batch} for the "
                "same samples per step (or Trainer(memory_budget_gb=...) splits batches itself)"
            )
        self.host.notify("info", f"memory plan row set: {row.describe()}" + ("; " + "; ".join(said) if said else ""))


def _bar(row: PlanRow, plan: MemoryPlan, top: float) -> str:
    width = 360

    def px(n: float) -> float:
        return width * n / top

    start = 0
    parts = []
    for name, color in PART_COLORS.items():
        v = int(row.parts.get(name, 0))
        if v > 0:
            parts.append(
                f'<div title="{name}: {_gib(v)}" style="position:absolute;left:{px(start):.1f}px;width:{px(v):.1f}px;'
                f'height:10px;background:{color}"></div>'
            )
            start += v
    line = (
        f'<div style="position:absolute;left:{px(plan.usable_bytes):.1f}px;width:2px;height:14px;top:-2px;'
        'background:#000"></div>'
    )
    return (
        f'<div class="nbt-plan-bar" style="position:relative;width:{width}px;height:10px">{"".join(parts)}{line}</div>'
    )
