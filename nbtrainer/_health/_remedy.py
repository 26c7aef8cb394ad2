"""What Health advises for a finding, computed from what it measured, and what a fix does at the step boundary.

For a problem, :meth:`Remedy.advise` writes the advice (saying how each number was computed) and the action
(``HealthReport.data``, applied by ``Health.apply_advice``, ``_fix``):

* the LR (``_advice.advise_lr``): an update ratio too large lowers it to move the weights by about 1% a step; a
  flat loss raises it the same way, unless the steps are of a healthy size while the loss stays at the chance level
  (then the labels, or the few parameters that train, are named and no LR is advised; nor is the LR it has);
  otherwise the largest ratio measured since the run (re)started decides, and
  without a measurement it is a tenth;
* clipping (``_advice.advise_clip``): for an exploding gradient norm and a loss spike with no LR change before it;
* damage: one diagnostic forward of the last batch (``_locate.check_batch``) tells whether units died or the loss
  is above the chance level; then the newest healthy snapshot taken at or before the problem's onset, else the last
  checkpoint written before it, else the advice to restart; units dead from the first step come back by
  re-initializing the layer that feeds them (``_units.UnitWatch.feeder``).

A Remedy is part of one :class:`~nbtrainer.Health` and works on its state (the measured ratios and norms, the
snapshots, the units seen); it keeps none of its own.
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._health._advice import HEALTHY_RATIO, advise_clip, advise_lr, reference, round_readable
from nbtrainer._health._health_report import SignalState, readable
from nbtrainer._health._judge import Draft
from nbtrainer._health._locate import check_batch
from nbtrainer._health._snapshot import Snapshots

if TYPE_CHECKING:
    from nbtrainer._health._fix import Fixer
    from nbtrainer._health._loss_watch import Stuck
    from nbtrainer._loop._host import LoopHost

__all__ = ["Remedy"]

log = logging.getLogger(__name__)


class Remedy:
    """The advice and the step-boundary half of the fixes of ``health`` (see the module docstring)."""

    def __init__(self, health: Any) -> None:
        # the Health whose state this works on, typed Any: _health imports this module (a type-only import back
        # would be a cycle, tests/test_architecture.py)
        self.health = health

    # -- advice ----------------------------------------------------------------------------------------------
    def advise(self, trainer: LoopHost, draft: Draft) -> tuple[str, dict[str, Any]]:
        """``(advice, data)`` of a report: the draft's own, with the computed LR, clipping and recovery."""
        advice, data = draft.advice, dict(draft.data)
        problem = draft.level == "problem"
        if not (problem or draft.lr_advice or draft.clip_advice):
            return advice, data
        parts = [advice] if advice else []
        reinit = self._reinit(list(draft.data.get("modules", {}))) if draft.kind == "dead_units" and problem else None
        if reinit is None and draft.kind == "not_learning" and problem:
            # Units dead since the first step and never alive since stop every layer before them from learning: a
            # loss that does not move is their doing, and no LR brings them back (the LR action did not help).
            dead = sorted(m for m in self.health._dead_at_init if m not in self.health._alive_at)
            reinit = self._reinit(dead) if dead else None
            if reinit is not None:
                parts.append(f"The cause: every unit of {', '.join(dead)} has been dead since the first step.")
        if reinit is not None:
            parts.append(reinit[1])
            data["reinit"] = reinit[0]
            return " ".join(parts), data
        lr = self._lr(trainer, draft)
        ref = reference(trainer.optimizer)
        if draft.kind == "not_learning" and problem and ref:
            steady = self._steady_steps(ref)
            if steady is not None:
                parts.append(self._not_the_lr(steady, ref))
                lr = None
        if lr is not None and ref and lr[0] == round_readable(ref):
            lr = None  # the LR it has: no change to advise (and none to apply)
        if lr is not None and ref:
            value, how = lr
            parts.append(f"{'Raise' if value > ref else 'Lower'} the LR to {readable(value)}: {how}.")
            data.update(lr=value, lr_factor=value / ref)
        if draft.clip_advice:
            parts.append(self._clip(draft, data))
        damage = self._damage(trainer, draft) if problem else None
        if damage is not None:
            parts.append(self._recovery(trainer, draft, damage, data))
        return " ".join(p for p in parts if p), data

    def _lr(self, trainer: LoopHost, draft: Draft) -> tuple[float, str] | None:
        """The advised LR: from the measured update ratio, at the current LR (a ratio measured at another LR
        scales in proportion)."""
        ref = reference(trainer.optimizer)
        if ref is None:
            return None
        h = self.health
        finder = trainer.run_state.lr_finder
        valley = finder.suggestions.get("valley") if finder is not None else None
        valley = valley if isinstance(valley, float) else None
        ratios = h._ratios  # (step, ratio, the LR it was measured at), since the run (re)started
        if draft.kind == "update_ratio":
            at = next((lr for s, _, lr in reversed(ratios) if s == draft.step), None)
            return advise_lr(ref, draft.data.get("update_ratio"), valley=valley, at_lr=at)
        if draft.kind == "not_learning" and draft.data.get("why") == "flat":
            if not ratios:
                return advise_lr(ref, None, valley=valley, raise_=True)
            recent = sorted(ratios[-3:], key=lambda r: r[1] * ref / r[2])[len(ratios[-3:]) // 2]  # the median
            return advise_lr(ref, recent[1], valley=valley, at_lr=recent[2])
        if not (draft.lr_advice or draft.kind in ("not_learning", "dead_units")):
            return None  # e.g. a spike with no LR change before it: clipping is the advice
        # damaged weights: the largest step since the run (re)started did it; otherwise the latest step says how
        # large the steps are at the LR now
        damaged = draft.kind in ("not_learning", "dead_units", "nonfinite")
        pick = max(ratios, key=lambda r: r[1] * ref / r[2]) if damaged and ratios else ratios[-1] if ratios else None
        if pick is not None and pick[1] * ref / pick[2] > HEALTHY_RATIO[1]:
            return advise_lr(ref, pick[1], valley=valley, at_lr=pick[2])
        if draft.kind == "dead_units":
            return None  # the steps were not too large: the LR is not what killed them
        said = "no measured step moved the weights by more than 1%" if ratios else "no update was measured"
        return advise_lr(ref, None, valley=valley, unmeasured=said)

    def _steady_steps(self, ref: float) -> float | None:
        """The median of the last measured update ratios (at the LR now) when it is of a healthy size while the
        loss stays at the chance level: an LR change would not make such a run learn; else None."""
        h = self.health
        ratios = h._ratios[-3:]
        if h._loss.chance is None or not ratios:
            return None
        scaled = sorted(r * ref / at for _, r, at in ratios)
        median = scaled[len(scaled) // 2]
        # the band's top doubled: 1.1% is the size the LR advice aims at, not a reason to change it
        return median if HEALTHY_RATIO[0] <= median <= 2 * HEALTHY_RATIO[1] else None

    def _not_the_lr(self, ratio: float, ref: float) -> str:
        """Why a run whose steps are of a healthy size does not learn: almost nothing trains, or the data."""
        h = self.health
        params = list(h._model.parameters()) if h._model is not None else []
        total = sum(p.numel() for p in params)
        trained = sum(p.numel() for p in params if p.requires_grad)
        steps = (
            f"Each step moves the trained weights by {ratio * 100:.2g}% of their norm at LR {readable(ref)}, a "
            "healthy size, yet the loss stays at the chance level: a different LR would not help."
        )
        if total and trained / total < 0.05:
            return (
                f"{steps} Only {trained:,} of the model's {total:,} parameters ({trained / total:.2%}) have "
                "requires_grad=True: unfreeze the layers meant to learn (p.requires_grad_(True)) and rebuild the "
                "optimizer with them."
            )
        return (
            f"{steps} Check the labels and the inputs: that each label belongs to its input (not shuffled apart or "
            "misaligned), that the inputs vary and are scaled, and that the model sees the features it needs."
        )

    def _clip(self, draft: Draft, data: dict[str, Any]) -> str:
        totals = self.health._grad_totals
        exploded = draft.data.get("grad_norm") if draft.kind == "grad_norm" else None
        clip = advise_clip(totals[:-1] if exploded is not None else totals, exploded)
        if clip is None:
            return "Clip such steps: Trainer(max_grad_norm=...) (no gradient norm was measured to size it)."
        value, how = clip
        data["max_grad_norm"] = value
        v = readable(value)
        return f"Clip the gradients at {v}: Trainer(max_grad_norm={v}) or trainer.set_max_grad_norm({v}); {how}."

    def _reinit(self, modules: list[str]) -> tuple[list[str], str] | None:
        """Units of ``modules`` dead since the first step (the initialization): re-initialize the layers that feed
        them."""
        h = self.health
        if not modules or not set(modules) <= h._dead_at_init or h._units is None:
            return None
        feeders = [f for f in (h._units.feeder(m) for m in modules) if f is not None]
        if not feeders:
            return None
        names = ", ".join(feeders)
        return feeders, (
            f"They were dead from the first step: the initialization of {names} (the layer feeding them) makes "
            f"them so. The action re-initializes {names} with PyTorch's default (reset_parameters) and drops its "
            "optimizer state; LeakyReLU or GELU would never die this way."
        )

    def _damage(self, trainer: LoopHost, draft: Draft) -> str | None:
        """Why the weights are damaged now (one diagnostic forward of the last batch), or None."""
        h = self.health
        kept = h._kept
        batch = kept.last if kept is not None and kept.last is not None else None
        if batch is None and kept is not None and kept.batches:
            batch = kept.batches[-1]
        if batch is None or trainer.batch_steps.training_step_fn is not None or trainer.strategy.distributed:
            return None
        steps = trainer.batch_steps
        try:
            dead, loss = check_batch(h._model, steps.compute, batch, steps.autocast())
        except Exception:  # a diagnostic never ends the run: no recovery advised
            log.debug("the batch check for a recovery failed (a diagnostic never ends the run)", exc_info=True)
            return None
        types = h._units.types if h._units is not None else {}
        why = []
        died = [m for m, (d, t) in dead.items() if t >= 2 and d == t and m not in h._dead_at_init]
        if died:
            why.append(f"every unit of {died[0]} ({types.get(died[0], 'ReLU')}) is dead")
        else:  # units that died since the run was healthy: half or more of a module, up by 30 points or more
            for m, (d, t) in dead.items():
                share, before = d / max(t, 1), h._healthy_dead.get(m, 0.0)
                if share >= 0.5 and share - before >= 0.3:
                    why.append(
                        f"{share:.0%} of the units of {m} ({types.get(m, 'ReLU')}) are dead, {before:.0%} before"
                    )
                    break
        chance = h._loss.chance
        # a spike with no LR change before it, seen right after its step: the last batch is the culprit, and its
        # loss says nothing of the weights (their units still do)
        if draft.kind == "loss_spike" and not draft.lr_advice and draft.step == trainer.global_step:
            pass
        elif not math.isfinite(loss):
            why.append(f"the loss of the last batch is {loss}")
        elif chance is not None and loss > 1.05 * chance:
            why.append(f"the loss of the last batch is {loss:.3g}, above the chance level {chance:.3g}")
        return ", ".join(why) or None

    def _recovery(self, trainer: LoopHost, draft: Draft, damage: str, data: dict[str, Any]) -> str:
        h = self.health
        onset = draft.onset if draft.onset is not None else draft.step
        raised = h._lr_raised_at
        if raised is not None and onset <= raised + 1 <= draft.step and draft.step - raised <= h.window:
            onset = raised + 1  # the evidence allows it: the LR increase did it, not the steps before
        snap = h._snaps.choose(onset)
        then = ", then applies the LR" if "lr" in data else ""  # the action sets an LR only when one is advised
        if snap is not None:
            data.update(restore="snapshot", restore_step=snap.step)
            return (
                f"The weights are damaged ({damage}): the action restores the weights and optimizer state Health "
                f"kept before step {snap.step}{then}."
            )
        path = self._checkpoint(trainer, onset)
        if path is not None:
            data["restore"] = "checkpoint"
            return (
                f"The weights are damaged ({damage}): the action rolls back to the last checkpoint ({path}, written "
                f"before step {onset}){then}."
            )
        data["restart"] = True
        why = f" ({h._snaps.off})" if h._snaps.off else ""
        lr = f" with LR {readable(data['lr'])}" if isinstance(data.get("lr"), float) else ""
        return (
            f"The weights are damaged ({damage}) and no snapshot or checkpoint from before step {onset} is left"
            f"{why}: these weights cannot be repaired; restart the run from a new model{lr}."
        )

    def _checkpoint(self, trainer: LoopHost, onset: int) -> str | None:
        """The ModelCheckpoint's last.ckpt when it holds the state before step ``onset`` (its saved step, read
        with ``mmap``: no tensor is loaded)."""
        checkpoint = ModelCheckpoint.find(trainer.callbacks.callbacks)
        path = checkpoint.last_model_path if checkpoint is not None and checkpoint.save_last else None
        if path is None or not os.path.exists(path):
            return None
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["loop"]["global_step"]
        except Exception:  # not readable now (being written, another format): not a way back
            log.debug("last.ckpt not readable now: not a way back", exc_info=True)
            return None
        return path if isinstance(saved, int) and saved < onset else None

    def stuck_draft(self, stuck: Stuck) -> Draft:
        """The report of a run that does not learn; the learning-rate light turns red."""
        h = self.health
        chance = h._loss.chance
        if stuck.why == "above_chance" and chance is not None:
            classes = round(math.exp(chance))
            message = (
                f"the loss stays above the chance level: {stuck.mean:.3g} over the last {h.window} steps, where a "
                f"uniform guess among {classes} classes gives {chance:.3g} (ln {classes})"
            )
            light = f"not learning: loss {stuck.mean:.3g}, above chance ({chance:.3g})"
        else:
            start = stuck.start if stuck.start is not None else stuck.mean
            message = f"the loss has not moved from {start:.3g} over the last {h.window} steps (now {stuck.mean:.3g})"
            light = f"not learning: loss flat at {stuck.mean:.3g}"
        # without a chance level a flat loss may also be a model that starts where it ends (a fine-tuned
        # regressor): told, without acting on it
        level = "warning" if chance is None else "problem"
        h._lights["learning"] = SignalState(level, light)
        h._lr_light()
        data = {"why": stuck.why, "loss": stuck.mean, "chance": chance}
        draft = Draft("not_learning", stuck.step, message, "The network is not learning.", data, lr_advice=True)
        draft.onset, draft.level = stuck.onset, level
        return draft

    # -- a fix at the step boundary (the training thread) ----------------------------------------------------
    def at_boundary(self, trainer: LoopHost, fixer: Fixer) -> None:
        """The LR change of a fix arrived: restore or re-initialize as planned, and start the fix's check."""
        h = self.health
        pending = fixer.take_pending()
        step = trainer.global_step
        if pending is not None:
            snap, reinit, action = pending
            if snap is not None and h._probe is not None:
                Snapshots.restore(snap, h._probe.params, h._model, trainer.optimizer)
                h._snaps.drop_after(snap.step)
            for name in reinit:
                _reinitialize(h._model, name, trainer.optimizer)
            epoch = trainer.run_state.loop_state.epoch + 1
            new = f"the weights before step {snap.step}" if snap is not None else ", ".join(reinit)
            trainer.history.add_event(step=step, epoch=epoch, kind="health_restore", old=action, new=new)
        check = fixer.check
        if check is not None and not check.started:
            check.started, check.step = True, step
            h._segment(step + 1)
            h._fix_note = ""
            h._lights["learning"] = SignalState("ok", f"fix applied at step {step}: checking the next {h.window} steps")
            h._lr_light()
            if h._started and h._armed_for is None:
                h._arm(trainer, step + 1)  # measure the first step after the fix


def _reinitialize(model: Any, name: str, optimizer: Any) -> None:
    """``reset_parameters()`` of module ``name``, and its parameters' optimizer state dropped."""
    module = dict(model.named_modules()).get(name)
    reset = getattr(module, "reset_parameters", None)
    if module is None or not callable(reset):
        return
    reset()
    params = {id(p) for p in module.parameters()}
    children = getattr(optimizer, "optimizers", None)
    for opt in children.values() if children else [optimizer]:
        for p in [p for p in opt.state if id(p) in params]:
            del opt.state[p]
