"""One click fixes what Health found: the advised action of a problem, applied, and the check that it worked.

:meth:`Health.apply_advice <nbtrainer.Health.apply_advice>` is the public action the panel's button calls. What it
applies comes with the report (``HealthReport.data``, ``HealthReport.action``), computed when the problem was filed
(:func:`advise`, from what Health measured):

* **damaged weights** (units that died, a loss above the chance level, non-finite weights, seen by one diagnostic
  forward of the last batch when the problem is filed): go back to the newest healthy snapshot taken at or before
  the damage began (``_snapshot``), else to the ModelCheckpoint's ``last.ckpt`` when it was written before it, else
  nothing can bring them back and the advice says to restart with the advised LR; units dead from the very first
  step come back by re-initializing the layer that feeds them;
* **the LR**: scaled from the measured update ratio (``_advice.advise_lr``); **clipping**: from the measured norms.

Where each part takes effect: the LR through ``trainer.set_lr(..., source="health")`` at the next step boundary
(marked on the panel's LR chart); clipping at once (``set_max_grad_norm``); a restore or re-initialization on the
training thread at that same boundary (:meth:`Fixer.at_boundary`, called by Health's ``on_control`` when the LR
change arrives), so the next step trains on the restored weights with the new LR; a checkpoint through
``trainer.rollback``. Between fits all of it applies at once.

After a fix, the next ``window`` steps are compared with the ``window`` before it (:meth:`Fixer.check`): a fix that
did not lower the loss, or left it at the chance level, is reported (``"fix_failed"``) with the next step to try. A
fix applied between fits is checked over the first window of the next fit of the same model
(:meth:`Fixer.start_fit`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._health._advice import main_optimizer
from nbtrainer._health._health_report import HealthReport, readable
from nbtrainer._health._snapshot import Snapshot, Snapshots
from nbtrainer._loop._control import reference_lr

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["Check", "Fixer"]


@dataclass
class Check:
    """A fix waiting for its verdict: the loss of the window before it, and what it did; ``started`` once it
    took effect at a step boundary (the loss statistics start again there)."""

    step: int
    action: str
    before: float | None
    data: dict[str, Any] = field(default_factory=dict)
    started: bool = False


class Fixer:
    """The fixes of one Health: the plan waiting for the training thread, the check of the last fix, and each
    fix's record (``Health.fixes``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: tuple[Snapshot | None, list[str], str] | None = None  # (snapshot, modules to reinit, action)
        self.check: Check | None = None
        self.fixes: list[dict[str, Any]] = []
        # The model the pending fix and its check are for: a weak reference, as an id may be reused by a model
        # built after this one is gone
        self._model: weakref.ref[Any] | None = None

    def start_fit(self, model: Any) -> None:
        """A fit of ``model`` starts. A fix applied between fits to this same model (the learner read the report,
        clicked, then trained on) keeps its check, judged on this fit's first window; another model's is dropped."""
        with self._lock:
            if self._model is None or self._model() is not model:
                self.pending, self.check, self._model = None, None, None

    # -- the click (any thread) ----------------------------------------------------------------------------
    def apply(self, trainer: LoopHost, report: HealthReport, snaps: Snapshots, before: float | None) -> str:
        """Apply ``report``'s advised action (module docstring); ``before``: the mean loss of the last window.
        Returns what was done, in words."""
        data = report.data
        action = report.action
        if not action:
            raise ValueError(
                f"Health has nothing to apply for this report ({report.kind} at step {report.step}): {report.advice}"
            )
        run = trainer.run_state
        if data.get("restore") == "checkpoint":
            # from another thread a rollback needs the run held at a step boundary: held for it, then let go
            hold = run.fitting and run.fit_thread != threading.get_ident() and trainer.status != "paused"
            if hold:
                trainer.pause()
            trainer.rollback("last")
            if hold:
                trainer.resume()
        snap = None
        if data.get("restore") == "snapshot":
            snap = next((s for s in snaps.kept if s.step == data.get("restore_step")), None)
            if snap is None:
                raise ValueError(
                    f"the snapshot before step {data.get('restore_step')} is no longer kept (a later fix or a "
                    "rollback replaced it): stop the run and restart it with the advised LR"
                )
        reinit = [str(n) for n in data.get("reinit") or []]
        step = trainer.global_step
        with self._lock:
            self.pending = (snap, reinit, action) if snap is not None or reinit else None
            self.check = Check(step, action, before, dict(data))
            self._model = weakref.ref(unwrap_model(trainer.model))
        clip = data.get("max_grad_norm")
        if isinstance(clip, (int, float)):
            trainer.set_max_grad_norm(float(clip))
        # The LR change is also what brings the restore to the training thread, at the step boundary where it
        # takes effect (Health's on_control sees it there; between fits at once): set even when unchanged.
        opt = main_optimizer(trainer.optimizer)
        if opt is not None:
            factor = data.get("lr_factor")
            lrs = trainer.lrs
            if lrs and isinstance(factor, (int, float)):
                for name, lr in lrs.items():
                    trainer.set_lr(lr * float(factor), optimizer=name, source="health")
            else:
                advised = data.get("lr")
                new = float(advised) if isinstance(advised, (int, float)) else reference_lr(opt)
                trainer.set_lr(new, source="health")
        self.fixes.append({"step": step, "kind": report.kind, "action": action, "before": before})
        trainer.history.add_event(step=step, epoch=report.epoch, kind="health_fix", old=report.kind, new=action)
        return action

    def take_pending(self) -> tuple[Snapshot | None, list[str], str] | None:
        with self._lock:
            pending, self.pending = self.pending, None
        return pending

    # -- the verdict --------------------------------------------------------------------------------------
    def verdict(self, after: float, chance: float | None) -> tuple[Check, bool] | None:
        """The check's verdict once a full window followed the fix (``after``: its mean loss): it worked when the
        loss fell by a tenth or more and is not at the chance level."""
        check = self.check
        if check is None or not check.started:
            return None
        self.check = None
        better = check.before is None or after < 0.9 * check.before
        learns = chance is None or after < 0.95 * chance
        worked = better and learns
        if self.fixes:
            self.fixes[-1].update(after=after, worked=worked)
        return check, worked


def next_step(check: Check, after: float, chance: float | None) -> tuple[str, str, dict[str, Any]]:
    """The report of a fix that did not work: ``(message, advice, data)``; the next LR goes ten times further the
    way the fix went (the snapshot it restored, when there was one, is restored again)."""
    data = check.data
    before = f"{check.before:.3g}" if check.before is not None else "?"
    at = f" (chance: {chance:.3g})" if chance is not None else ""
    message = (
        f"the fix at step {check.step} ({check.action}) did not work: the loss is {after:.3g} over the steps since, "
        f"against {before} before it{at}"
    )
    lr = data.get("lr")
    factor = data.get("lr_factor")
    out: dict[str, Any] = {"after": after, "before": check.before}
    tip = ""
    if isinstance(lr, (int, float)) and isinstance(factor, (int, float)) and factor > 0:
        step = 0.1 if factor < 1 else 10.0
        out.update(lr=float(f"{lr * step:.1g}"), lr_factor=factor * step)
        tip = f" or try LR {readable(float(out['lr']))}"
    if data.get("restore") == "snapshot":
        out.update(restore="snapshot", restore_step=data.get("restore_step"))
    advice = (
        "Next: find the LR from these weights with the LR finder (trainer.lr_find(loader), or the panel's LR "
        f"finder) and apply its valley{tip}."
    )
    return message, advice, out
