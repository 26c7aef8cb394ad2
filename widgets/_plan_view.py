"""The panel's memory plan: a budget, a Plan button, each row of :func:`nbtrainer.plan_memory` as a stacked bar; a
click on a row sets the panel's controls (precision, checkpointing, accumulation) and memory savers before Start.

Planning runs in a helper thread (an 8B decoder takes seconds; the kernel stays free). What the view needs from the
panel is :class:`PlanHost`; it reads only public names of the core.
"""

from __future__ import annotations

import concurrent.futures
import html
import logging
import threading
from typing import Any, Protocol

import ipywidgets as W

from nbtrainer import MemoryOptions, Trainer, start_training_thread
from nbtrainer.profile import PART_COLORS, MemoryPlan, PlanRow, example_batch, plan_memory

from ._layouts import plain_html, shared_layout
from ._lifecycle import replace_children
from ._savers import AS_GIVEN, Savers
from ._section import Section
from ._theme import FG2
from ._view import PanelView

__all__ = ["PlanHost", "PlanView"]

log = logging.getLogger(__name__)
S = MemoryOptions.SWITCH

#: a row's switches the panel has no control for (a plan picks them for Hugging Face models)
_NO_CONTROL = (S.chunked_loss, S.attention)


class PlanHost(Protocol):
    """What the plan view needs from the panel that owns it (``TrainerWidget`` implements it)."""

    @property
    def trainer(self) -> Trainer: ...

    @property
    def train_loader(self) -> Any: ...

    @property
    def running(self) -> bool: ...

    def notify(self, level: str, text: str, details: str | None = None) -> None: ...

    def use_batch_size(self, batch_size: int) -> bool:
        """Train on batches of ``batch_size`` from now on; False where the train loader is not the panel's."""
        ...


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
        self.note = plain_html()
        self.note.add_class("nbt-plan-note")
        self.rows = W.VBox(layout=shared_layout())
        self.rows.add_class("nbt-plan-rows")
        self.section = Section("memory plan", "nbt-plan-view", closable=False)
        self.section.show(
            W.HBox([self.budget, self.plan_button], layout=shared_layout(align_items="center")),
            self.note,
            self.rows,
            detail="which switches fit, before Start",
            is_open=False,
        )
        self.root = self.section.root
        self.plan: MemoryPlan | None = None
        self.thread: threading.Thread | None = None
        self.cancel = threading.Event()  # ends the plan being made: the panel closes, the interpreter exits
        self.closed = False  # the panel was closed: a plan that ends now is not drawn
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
        self.cancel = threading.Event()
        # start_training_thread: planning runs torch ops (on the meta device), so an interpreter that exits while it
        # plans cancels the plan and waits for the row being simulated, instead of aborting mid-op ("terminate
        # called") or waiting for the whole search (a minute on a loaded machine); and it plans at full speed
        self.thread = start_training_thread(
            self._plan, args=(float(self.budget.value), self.cancel), name="nbtrainer-plan", stop=self.cancel.set
        )

    def _plan(self, budget_gb: float, cancel: threading.Event) -> None:
        trainer = self.host.trainer
        try:
            batch = example_batch(self.host.train_loader)
            plan = plan_memory(
                self.model,
                batch,
                budget_gb=budget_gb,
                device=trainer.device,
                criterion=trainer.criterion,
                cancel=cancel,
            )
            _ = plan.rows, plan.best  # every row simulated here, in this thread: show() only draws them
        except concurrent.futures.CancelledError:  # the panel closed or the interpreter exits: nothing to show
            self.note.value = ""
            return
        except Exception as exc:  # the planner's message says what is wrong and the fix
            log.debug("the memory plan failed: its message is shown in the panel", exc_info=True)
            self.note.value = ""
            self.host.notify("error", f"memory plan: {exc}")
            return
        finally:
            self.plan_button.disabled = False
        if not self.closed:  # drawn after close(), its buttons would be widgets of a panel that is gone
            self.show(plan)

    def close(self) -> None:
        """The panel is closing: cancel a plan being made, wait for the row being simulated (a second), draw nothing."""
        self.closed = True
        self.cancel.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

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
        replace_children(self.rows, tuple(children))  # the last plan's rows closed: each plan makes its own
        best = plan.best.describe() if plan.best is not None else "nothing fits: smaller batch, LoRA or a bigger device"
        self.note.value = (
            f"<span style='color:{FG2}'>{html.escape(plan.device)}, batch {plan.batch_size}, "
            f"planned in {plan.seconds:.1f} s; best: <b>{html.escape(best)}</b>. Click a row to set the controls."
            "</span>"
        )
        self.section.set_open(True)

    def choose(self, row: PlanRow) -> None:
        """Set the panel's controls, memory savers and batch size to ``row`` (applied at Start); what the panel cannot
        apply here is named in the message, which is a warning then."""
        if self.host.running:
            self.host.notify("warning", "a plan row is applied before Start: stop the run first")
            return
        m, view = row.memory, self.view
        view.precision.value = m.precision
        view.checkpointing.value = bool(m.activation_checkpointing)
        view.accum.value = row.grad_accum_steps  # also back to 1 after a row that split the batch
        missed = self._savers_to(m)
        if not isinstance(m.activation_checkpointing, bool):  # some blocks (k, a share, types): the box has all or none
            missed.append(f"activation_checkpointing={m.activation_checkpointing!r} (the box checkpoints every block)")
        missed += [f"{k}={v!r} (no control in the panel)" for k, v in m.changed().items() if k in _NO_CONTROL]
        batch = row.micro_batch * row.grad_accum_steps
        if not self.host.use_batch_size(row.micro_batch) and row.grad_accum_steps > 1:
            missed.append(
                f"micro-batch {row.micro_batch}: the train loader was given, so its batches stay as they are; give it "
                f"batch_size={row.micro_batch} for {batch} samples per step (or Trainer(memory_budget_gb=...) splits "
                "batches itself)"
            )
        text = f"memory plan row set: {row.describe()}"
        if missed:
            text = f"memory plan row set in part: {row.describe()}; not applied: " + "; ".join(missed)
        self.host.notify("warning" if missed else "info", text)

    def _savers_to(self, m: MemoryOptions) -> list[str]:
        """The memory savers set to ``m``'s; returns what could not be (locked, or not runnable here)."""
        savers = self.savers
        wanted = {
            "optimizer": m.optimizer if m.optimizer not in (None, "adamw") else AS_GIVEN,
            S.quantize: m.quantize or "none",
            S.lora: m.lora or None,
            S.offload_activations: m.offload_activations,
            S.offload_optimizer: m.offload_optimizer,
            S.optimizer_in_backward: m.optimizer_in_backward,
        }
        if savers.locked_reason:  # a built Trainer, or savers applied already: the boxes keep what they show
            asked = [f"{k}={v!r}" for k, v in wanted.items() if v not in (AS_GIVEN, "none", None, False)]
            return [f"{', '.join(asked)} ({savers.locked_reason})"] if asked else []
        missed = []
        for menu, key in ((savers.optimizer, "optimizer"), (savers.quantize, S.quantize)):
            value, why = wanted[key], savers.reasons.get(f"{key}:{wanted[key]}")
            if value not in [v for _, v in menu.options] or why:
                missed.append(f"{key} {value} ({why or 'not in the menu'})")
                value = menu.options[0][1]  # as given / none: a menu never shows a choice the run will not get
            menu.value = value
        savers.set_lora(wanted[S.lora])
        for key, box in (
            (S.offload_activations, savers.offload_activations),
            (S.offload_optimizer, savers.offload_optimizer),
            (S.optimizer_in_backward, savers.in_backward),
        ):
            why = savers.reasons.get(key) if wanted[key] else None
            if why:
                missed.append(f"{key} ({why})")
            box.value = bool(wanted[key]) and not why
        lora_why = savers.reasons.get(S.lora)
        if wanted[S.lora] and lora_why:
            missed.append(f"{S.lora} ({lora_why})")
            savers.lora.value = False
        return missed


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
