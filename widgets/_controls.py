"""The panel's controls, bound to the Trainer's public setters.

LR, gradient accumulation and clipping change mid-run (applied by the trainer at the next optimizer
step and recorded in ``history.events``); precision, epochs, the schedule and activation
checkpointing are locked while a run is alive and take effect at the next Start.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer import format_lr, precision_support

from ._lr_control import LRControl
from ._style import set_tooltip
from ._theme import FG2

if TYPE_CHECKING:
    from nbtrainer import Trainer

__all__ = ["SCHEDULES", "Controls"]

log = logging.getLogger(__name__)

SCHEDULES = {"constant": "constant LR", "onecycle": "one-cycle (max LR)", "cosine": "cosine decay"}
_OneCycle = torch.optim.lr_scheduler.OneCycleLR
_GROUP_LRS = ("lr", "initial_lr", "max_lr", "min_lr")  # what a scheduler keeps in each param group


class Controls:
    def __init__(self, view: Any, trainer: Trainer, epochs: int, notify: Callable[[str, str], None]) -> None:
        self.view, self.trainer, self.notify = view, trainer, notify
        self.running = False
        self._syncing = False
        self._user_scheduler, self._user_interval = trainer.scheduler, trainer.scheduler_interval
        self._user_groups: list[dict[str, Any]] | None = None  # the groups' LRs as the user's scheduler left them
        self.support = precision_support(trainer.device)
        v = view
        v.precision.options = [(n if ok else f"{n} (unavailable)", n) for n, (ok, _) in self.support.items()]
        v.precision.value = trainer.precision
        off = [f"{n}: {reason}" for n, (ok, reason) in self.support.items() if not ok]
        v.precision_note.value = (
            (f"<span style='font-size:11px;color:{FG2}'>unavailable on {trainer.device}: " + "; ".join(off) + "</span>")
            if off
            else ""
        )
        set_tooltip(v.precision, "; ".join(off) or f"all precisions run on {trainer.device}")
        v.accum.value = trainer.grad_accum_steps
        self.lr = LRControl(v.lr, v.lr_exact, self._apply_lr, notify)
        self.lr.show(trainer.lr)
        self._show_optimizers()
        v.lr_target.observe(self._on_lr_target, "value")
        v.epochs.value = epochs
        options = []
        if trainer.scheduler is not None:
            options.append((f"keep {type(trainer.scheduler).__name__}", "keep"))
        options += [(label, key) for key, label in SCHEDULES.items()]
        v.scheduler.options = options
        v.scheduler.value = options[0][1]
        v.max_grad_norm.value = float(trainer.max_grad_norm or 0.0)
        v.checkpointing.value = bool(trainer.checkpointed_blocks)
        self._lr_label()
        v.precision.observe(self._on_precision, "value")
        v.accum.observe(self._on_accum, "value")
        v.max_grad_norm.observe(self._on_clip, "value")
        v.checkpointing.observe(self._on_checkpointing, "value")
        v.scheduler.observe(lambda _: self._lr_label(), "value")

    # -- helpers -------------------------------------------------------------------------------------
    def _set(self, widget: Any, name: str, value: Any) -> None:
        """Change a control from code without triggering its handler."""
        self._syncing = True
        try:
            setattr(widget, name, value)
        finally:
            self._syncing = False

    def _lr_label(self) -> None:
        choice = self.view.scheduler.value
        one_cycle = choice == "onecycle" or (choice == "keep" and isinstance(self._user_scheduler, _OneCycle))
        self.view.lr.description = "max LR" if one_cycle else "LR"

    def choose_lr(self, lr: float) -> None:
        """Set the LR from code (the LR finder) as if the slider had been moved there.

        The slider is set without its handler and ``set_lr`` is called directly: if the slider already
        showed this value there would be no change event, yet the trainer may hold another LR (a
        schedule ran since). Idle: applied now (and Start uses the slider value); mid-run: next step.
        """
        lr = float(lr)
        self.lr.show(lr)
        self._apply_lr(lr, "lr finder")

    def _show_optimizers(self) -> None:
        """Several named optimizers: the target menu (which one the LR control sets) and each one's LR."""
        v, lrs = self.view, self.trainer.lrs
        shown = "" if lrs else "none"
        v.lr_target.layout.display = v.lr_readout.layout.display = shown
        if lrs:
            if [value for _, value in v.lr_target.options] != ["", *lrs]:
                self._set(v.lr_target, "options", [("all", ""), *((name, name) for name in lrs)])
            v.lr_readout.value = (
                f"<span style='font-size:11px;color:{FG2}'>LR by optimizer: "
                + " · ".join(f"<b>{html.escape(n)}</b> {format_lr(lr)}" for n, lr in lrs.items())
                + "</span>"
            )

    def _on_lr_target(self, change: Any) -> None:
        if self._syncing:
            return
        name = change["new"]
        lrs = self.trainer.lrs
        self.lr.show(lrs.get(name, self.trainer.lr))

    def use_trainer(self, trainer: Trainer) -> None:
        """Steer ``trainer`` from now on (the panel rebuilt it at Start); its schedule is the one "keep" restores."""
        self.trainer = trainer
        self._user_scheduler, self._user_interval = trainer.scheduler, trainer.scheduler_interval
        self._user_groups = None
        self._show_optimizers()

    def set_running(self, running: bool) -> None:
        self.running = running
        for w in (self.view.precision, self.view.epochs, self.view.scheduler, self.view.checkpointing):
            w.disabled = running

    def on_event(self, event: dict[str, Any]) -> None:
        """A control change that took effect (maybe requested from code): show it in the controls."""
        kind, new = event.get("kind"), event.get("new")
        if kind == "lr" and isinstance(new, (int, float)) and new > 0:
            self.lr.show(new)
            self._show_optimizers()
        elif isinstance(kind, str) and kind.startswith("lr:"):  # one of several named optimizers
            if self.view.lr_target.value == kind[3:] and isinstance(new, (int, float)):
                self.lr.show(new)
            self._show_optimizers()
        elif kind == "grad_accum_steps" and isinstance(new, int):
            self._set(self.view.accum, "value", new)

    # -- handlers (the kernel's thread) ---------------------------------------------------------
    def _on_precision(self, change: Any) -> None:
        if self._syncing:
            return
        name = change["new"]
        ok, reason = self.support.get(name, (False, "unknown precision"))
        try:
            if not ok:
                raise ValueError(f"{name} is not available on {self.trainer.device}: {reason}")
            self.trainer.set_precision(name)
            self.notify("info", f"precision {name} from the next run")
        except Exception as exc:
            log.debug("the precision was refused: the panel says why and shows the trainer's", exc_info=True)
            self.notify("warning", str(exc))
            self._set(self.view.precision, "value", self.trainer.precision)

    def _on_accum(self, change: Any) -> None:
        if self._syncing:
            return
        k, t = change["new"], self.trainer
        if self.running and isinstance(t.scheduler, _OneCycle) and k < t.grad_accum_steps:
            self.notify(
                "warning",
                "Lowering accumulation mid-run adds optimizer steps beyond the OneCycleLR "
                "schedule's total_steps (it would fail). Change it between runs instead.",
            )
            self._set(self.view.accum, "value", t.grad_accum_steps)
            return
        try:
            t.set_grad_accum_steps(int(k))  # mid-run: applied at the next step; the event is shown then
        except ValueError as exc:  # e.g. optimizer_in_backward keeps no gradients to accumulate
            self.notify("warning", str(exc))
            self._set(self.view.accum, "value", t.grad_accum_steps)

    def _apply_lr(self, lr: float, source: str) -> None:
        try:
            # mid-run: applied at the next step; the event is shown then. "" (all) or one named optimizer
            self.trainer.set_lr(float(lr), optimizer=self.view.lr_target.value or None, source=source)
            if not self.running:
                self._show_optimizers()
        except ValueError as exc:
            self.notify("warning", str(exc))

    def _on_clip(self, change: Any) -> None:
        if self._syncing:
            return
        value = float(change["new"])
        try:
            self.trainer.set_max_grad_norm(value if value > 0 else None)
        except ValueError as exc:  # e.g. optimizer_in_backward: no moment when every gradient exists
            self.notify("warning", str(exc))
            self._set(self.view.max_grad_norm, "value", self.trainer.max_grad_norm or 0.0)

    def _on_checkpointing(self, change: Any) -> None:
        if self._syncing:
            return
        try:
            blocks = self.trainer.set_activation_checkpointing(bool(change["new"]))
            self.notify(
                "info",
                f"activation checkpointing on {len(blocks)} block(s)"
                if change["new"]
                else "activation checkpointing off",
            )
        except Exception as exc:
            log.debug("activation checkpointing was refused: the panel says why and shows the trainer's", exc_info=True)
            self.notify("warning", f"activation checkpointing: {exc}")
            self._set(self.view.checkpointing, "value", bool(self.trainer.checkpointed_blocks))

    # -- at Start ------------------------------------------------------------------------------------
    def apply_schedule(self, train_loader: Any, epochs: int) -> None:
        """Install the chosen LR schedule for a run of ``epochs`` (raises ValueError with the reason)."""
        t, choice = self.trainer, self.view.scheduler.value
        # the control shows what the run trains at: a set_lr() from code since the last run is the trainer's LR
        self.lr.show(t.lrs.get(self.view.lr_target.value, t.lr))
        if choice == "keep":
            if t.scheduler is not self._user_scheduler:
                self._keep_user_scheduler()
            s = t.scheduler
            if isinstance(s, _OneCycle) and s.last_epoch >= s.total_steps:
                raise ValueError(
                    "The OneCycleLR schedule is used up (it ran all its total_steps). Pick "
                    "'one-cycle' in the schedule menu to rebuild it for this run."
                )
            return
        total = None
        if choice != "constant":
            try:
                total = t.total_steps(train_loader, epochs)
            except TypeError as exc:
                raise ValueError(f"The {SCHEDULES[choice]} schedule needs the number of steps: {exc}") from None
        opt = t.optimizer
        assert opt is not None  # the panel's Trainer always has one (TrainerWidget builds or checks it)
        if t.scheduler is self._user_scheduler and t.scheduler is not None:  # "keep" must find its groups again
            self._user_groups = [{k: g[k] for k in _GROUP_LRS if k in g} for g in opt.param_groups]
        self._reset_groups()
        if choice == "constant":
            t.set_scheduler(None)
        elif choice == "onecycle":
            t.set_scheduler(_OneCycle(opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=total), "step")
        else:
            assert total is not None  # counted above for every schedule but "constant"
            t.set_scheduler(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total), "step")

    def _keep_user_scheduler(self) -> None:
        """Put the user's scheduler back after runs on the menu's schedules, on the groups' LRs as it left them: the
        menu's schedule ended elsewhere (a cosine near 0) and took off the keys it reads (OneCycleLR's
        ``initial_lr``). A reference LR set since (the control) is the next run's, the schedule scaled to it."""
        t = self.trainer
        assert t.optimizer is not None  # the panel's Trainer always has one
        groups, lrs, lr = t.optimizer.param_groups, t.lrs, t.lr
        saved = self._user_groups
        if saved is not None and len(saved) == len(groups):
            for group, keys in zip(groups, saved, strict=True):
                for key in _GROUP_LRS:
                    group.pop(key, None)
                group.update(keys)
        t.set_scheduler(self._user_scheduler, self._user_interval)
        for name, value in lrs.items():  # several named optimizers: each its own reference
            if t.lrs[name] != value:
                t.set_lr(value, optimizer=name)
        if not lrs and t.lr != lr:
            t.set_lr(lr)

    def _reset_groups(self) -> None:
        """Every group back to its plain reference LR, scheduler bookkeeping removed. Not scaled to the control's
        value: the control's changes were applied when made (set_lr), and with several named optimizers it shows
        one of them, whose LR scaled onto every group once moved all of them."""
        self.trainer.lr  # noqa: B018 (raises, naming the fix, when the Trainer has no optimizer)
        assert self.trainer.optimizer is not None
        for g in self.trainer.optimizer.param_groups:
            g["lr"] = float(g.get("max_lr", g.get("initial_lr", g["lr"])))
            for key in ("initial_lr", "max_lr", "min_lr"):
                g.pop(key, None)
