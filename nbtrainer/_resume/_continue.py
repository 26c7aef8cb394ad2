"""Continuing a run on purpose: N more epochs after a finished, stopped or resumed fit, with a fresh LR
schedule for the extension; and the check that refuses a schedule too short for the steps a fit asks for.

A OneCycleLR is built for a fixed number of steps and raises on the step after its last one ("Tried to
step 109 times. The specified number of total steps is 108"). A checkpoint carries its scheduler, so
resuming a finished OneCycle run with more epochs used to fail at its first step. Now every fit checks,
before anything is loaded or trained, that the scheduler it will step (the live one, or the one in the
checkpoint) has the steps left, and points to :meth:`Trainer.fit_more` when it has not.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._batch import safe_len
from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._loop._control import reference_key

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = [
    "CONTINUE",
    "IF_EXISTS",
    "Plan",
    "check_position",
    "check_resume",
    "check_schedule",
    "completed_epochs",
    "fit_more",
    "resolve_if_exists",
    "resume_fit",
    "schedule_capacity",
    "steps_left",
]


class _InPlace(str):
    """The ``resume_from`` that :func:`fit_more` hands to ``fit``: the run's state is already in place."""


CONTINUE = _InPlace("<the run's state, already in place>")

# Keys LR schedulers keep in param groups (the schedule's own bookkeeping, not hyper-parameters).
_SCHEDULE_KEYS = ("initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum")

_HOW = (
    "To train more epochs of this run with a fresh schedule for them, use trainer.fit_more(train_loader, "
    "val_loader, epochs=N{resume}, scheduler=lambda optimizer, steps: torch.optim.lr_scheduler.OneCycleLR("
    "optimizer, max_lr=..., total_steps=steps))"
)


@dataclass
class Plan:
    """What a fit will ask of its scheduler: the train loader, total epochs and max_steps."""

    train_loader: Any
    epochs: int
    max_steps: int | None

    def batches(self, trainer: LoopHost) -> int | None:
        return safe_len(trainer.strategy.prepare_loader(self.train_loader, train=True))  # this rank's share


def steps_left(loop: dict[str, Any], batches: int | None, accum: int, epochs: int, max_steps: int | None) -> int | None:
    """Optimizer steps from the position ``loop`` (a LoopState dict) to the end of a fit of ``epochs``.

    Windows never straddle epochs, so the current epoch has ``ceil(batches_left / accum)`` steps left.
    ``None`` when the loader has no ``len()`` and no ``max_steps`` bounds the fit.
    """
    done = int(loop.get("global_step", 0))
    cap = None if max_steps is None else max(max_steps - done, 0)
    if batches is None:
        return cap
    per_epoch = math.ceil(batches / accum)
    epoch, batch = int(loop.get("epoch", 0)), int(loop.get("batch", 0))
    if loop.get("epoch_complete", False):
        left = per_epoch * max(epochs - epoch - 1, 0)
    elif epoch >= epochs:
        left = 0
    else:
        left = math.ceil(max(batches - batch, 0) / accum) + per_epoch * (epochs - epoch - 1)
    return left if cap is None else min(left, cap)


def completed_epochs(loop: dict[str, Any]) -> int:
    """Epochs a run has finished, from its loop state (a LoopState dict, as in a checkpoint)."""
    return int(loop.get("epoch", 0)) + (1 if loop.get("epoch_complete", False) else 0)


def _epochs_left(loop: dict[str, Any], epochs: int) -> int:
    return max(epochs - completed_epochs(loop), 0)


def schedule_capacity(cls_name: str, state: dict[str, Any]) -> tuple[int, int] | None:
    """``(total, taken)`` for a scheduler that cannot step past its end (OneCycleLR), else None."""
    if cls_name != "OneCycleLR" or "total_steps" not in state:
        return None
    return int(state["total_steps"]), int(state.get("last_epoch", 0))


def check_schedule(
    trainer: LoopHost,
    plan: Plan,
    *,
    scheduler_state: dict[str, Any] | None = None,
    scheduler_class: str | None = None,
    loop: dict[str, Any] | None = None,
    accum: int | None = None,
    source: str = "this trainer's",
    resume_hint: str = "",
) -> None:
    """Refuse, before any step, a fit whose scheduler would run out (OneCycleLR built for fewer steps).

    Defaults check the trainer's live scheduler from a fresh start; a resume passes the checkpoint's
    scheduler state, loop state and accumulation instead.
    """
    if scheduler_state is None:
        sched = trainer.scheduler
        if sched is None:
            return
        scheduler_state, scheduler_class = sched.state_dict(), type(sched).__name__
    cap = schedule_capacity(scheduler_class or "", scheduler_state)
    if cap is None:
        return
    total, taken = cap
    fresh = loop is None and taken == 0  # a schedule built for this very fit
    loop = loop if loop is not None else {}
    accum = accum or trainer.grad_accum_steps
    per_step = trainer.options.step.scheduler_interval == "step"
    batches: int | None = None
    if per_step:
        batches = plan.batches(trainer)  # this rank's share under DDP, as trainer.total_steps() counts
        need = steps_left(loop, batches, accum, plan.epochs, plan.max_steps)
        unit = "steps"
    else:
        need, unit = _epochs_left(loop, plan.epochs), "epochs"
    if need is None:
        return
    if need < total and fresh and plan.max_steps is None:
        _warn_unfinished(total, need, batches, accum, plan.epochs)
    if need <= total - taken:
        return
    if fresh and per_step:  # say how to size it
        if batches is None:
            raise ValueError(
                f"OneCycleLR was built for total_steps={total} but this fit runs up to max_steps={plan.max_steps} "
                f"optimizer steps; it would fail part-way. Build it with total_steps={plan.max_steps} (the "
                "train_loader has no len(), so trainer.total_steps() cannot count)."
            )
        raise ValueError(
            f"OneCycleLR was built for total_steps={total} but this fit takes {need} optimizer steps ({batches} "
            f"batches / grad_accum_steps={accum}, {plan.epochs} epochs); it would fail part-way. Build it with "
            "total_steps=trainer.total_steps(train_loader, epochs)."
        )
    raise ValueError(
        f"{source[:1].upper()}{source[1:]} {scheduler_class} has {max(total - taken, 0)} of its total_steps={total} "
        f"{unit} left ({taken} taken), but this fit (epochs={plan.epochs}"
        + (f", max_steps={plan.max_steps}" if plan.max_steps is not None else "")
        + f") needs {need} more: it would fail part-way (OneCycleLR cannot step past its end). "
        + _HOW.format(resume=resume_hint)
        + "; or, for a new run, build a new scheduler for it (trainer.set_scheduler(...))."
    )


def _warn_unfinished(total: int, need: int, batches: int | None, accum: int, epochs: int) -> None:
    """A OneCycleLR built for this fit but for more steps than it takes ends before it anneals: the fit's last LR is
    mid-schedule (near the peak when it is far too long), and nothing fails to say so."""
    if batches is None:  # stepped per epoch
        taken = f"steps it once per epoch (scheduler_interval='epoch'), {need} epochs"
        fix = (
            "Step it per optimizer step (scheduler_interval='step') with total_steps=trainer.total_steps(train_loader, "
            f"epochs), or build it with total_steps={need} (the epochs)"
        )
    else:
        taken = f"takes {need} optimizer steps ({batches} batches / grad_accum_steps={accum}, {epochs} epochs)"
        if accum > 1 and total == batches * epochs:
            taken += f"; {batches} x {epochs} counts batches, and each optimizer step takes {accum} of them"
        fix = "Build it with total_steps=trainer.total_steps(train_loader, epochs) (it counts the accumulation)"
    warnings.warn(
        f"OneCycleLR was built for total_steps={total} but this fit {taken}: the schedule stops after {need} of its "
        f"{total} steps, before its annealing ends, and the run ends at a higher LR than it was built to end at. "
        f"{fix}, or fit for as long as it was built for.",
        stacklevel=7,  # the user's fit() call
    )


def _reset_for_fresh_schedule(optimizer: torch.optim.Optimizer) -> None:
    """Each group's LR back to the run's reference LR (OneCycle's ``max_lr``, else the LR the old schedule
    started from), without the old schedule's bookkeeping keys, so a new scheduler starts from it."""
    for group in optimizer.param_groups:
        ref = group[reference_key(group)]
        for key in _SCHEDULE_KEYS:
            group.pop(key, None)
        group["lr"] = ref


def _check_factory(scheduler: Any) -> None:
    if scheduler in ("keep", None):
        return
    if isinstance(scheduler, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)):
        raise TypeError(
            "fit_more(scheduler=...) takes a function (optimizer, total_steps) -> scheduler, not a scheduler: "
            "it is built after the run's state is loaded, for the extension's steps, e.g. scheduler=lambda "
            "optimizer, steps: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=steps)."
        )
    if not callable(scheduler):
        raise TypeError(
            f"fit_more(scheduler=...) must be 'keep', None or a function (optimizer, total_steps) -> scheduler, "
            f"got {type(scheduler).__name__}."
        )


def fit_more(
    trainer: LoopHost,
    train_loader: Any,
    val_loader: Any = None,
    *,
    epochs: int,
    resume_from: str | None = None,
    scheduler: str | Callable[[torch.optim.Optimizer, int], Any] | None = "keep",
    max_steps: int | None = None,
    profiler: Any = None,
    val_data: Any = None,
    batch_size: int | None = None,
    shuffle: bool | None = None,
) -> Any:
    """:meth:`Trainer.fit_more` (documented there). Arrays with ``batch_size=`` (``val_data=``, ``shuffle=``) become
    loaders as in ``fit``."""
    from nbtrainer._data._arrays import fit_loaders
    from nbtrainer._resume import _checkpoint_state as _state

    train_loader, val_loader = fit_loaders(
        train_loader, val_loader, val_data=val_data, batch_size=batch_size, shuffle=shuffle, caller="fit_more"
    )

    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"fit_more: epochs (how many more) must be an int >= 1, got {epochs!r}.")
    if max_steps is not None and (not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 1):
        raise ValueError(
            f"fit_more: max_steps (steps of the extension) must be an int >= 1 or None, got {max_steps!r}."
        )
    _check_factory(scheduler)
    if trainer.run_state.fitting:
        raise RuntimeError("This trainer is fitting; fit_more() continues a run once it has ended.")
    fresh = scheduler != "keep"
    if resume_from is not None:
        plans: list[Plan] = []

        def before_load(ckpt: dict[str, Any]) -> None:  # after the compatibility checks, before any load
            loop = ckpt["loop"]
            done = int(loop.get("global_step", 0))
            plan = Plan(train_loader, completed_epochs(loop) + epochs, None if max_steps is None else done + max_steps)
            plans.append(plan)
            if not fresh:
                check_resume(trainer, plan, ckpt, resume_hint=", resume_from=...")
            else:
                check_position(trainer, plan, loop, ckpt=ckpt)

        _state.restore(trainer, resume_from, load_scheduler=not fresh, before_load=before_load)
        plan = plans[0]
    else:
        st = trainer.run_state.loop_state
        if st.global_step == 0 and not trainer.history.epochs:
            raise RuntimeError(
                "fit_more() continues a run, and this trainer has not trained yet: call trainer.fit(...) first, "
                "or pass resume_from= a checkpoint of the run to continue."
            )
        plan = Plan(
            train_loader,
            completed_epochs(st.state_dict()) + epochs,
            None if max_steps is None else st.global_step + max_steps,
        )
        check_position(trainer, plan, st.state_dict())
        if not fresh:
            check_schedule(trainer, plan, loop=st.state_dict())
        # This fit's own History: a copy of the run so far (the History returned earlier stays as it was).
        trainer.run_state.continue_history()
    if fresh:
        _install_fresh_schedule(trainer, scheduler, plan)
    st = trainer.run_state.loop_state
    done = completed_epochs(st.state_dict())
    # Where the extension starts, for charts and summaries: epochs done -> the new total.
    trainer.history.add_event(step=st.global_step, epoch=done, kind="fit_more", old=done, new=plan.epochs)
    return trainer.fit(
        train_loader, val_loader, epochs=plan.epochs, max_steps=plan.max_steps, resume_from=CONTINUE, profiler=profiler
    )


def total_steps(trainer: LoopHost, train_loader: Any, epochs: int, *, batch_size: int | None = None) -> int:
    """``Trainer.total_steps``: ``ceil(batches / accum) * epochs``, counting this rank's share under DDP."""
    train_loader = _arrays.as_loader(train_loader, batch_size=batch_size)
    n = safe_len(trainer.strategy.prepare_loader(train_loader, train=True))
    if n is None:
        raise TypeError("The loader has no len(); pass total_steps to your scheduler yourself.")
    return math.ceil(n / trainer.grad_accum_steps) * epochs


#: ``resume_from`` values that start fresh when there is no ``last.ckpt`` yet (preemptible jobs).
IF_EXISTS = ("last-if-exists", "auto")


def resolve_if_exists(trainer: LoopHost, resume_from: str) -> tuple[str | None, str]:
    """``resume_from="last-if-exists"`` (or ``"auto"``): ``("last", note)`` when the ModelCheckpoint's
    ``last.ckpt`` exists, ``(None, note)`` (a fresh start) when it does not; ``note`` says which, for the log."""
    import os

    found = ModelCheckpoint.find(trainer.callbacks.callbacks)
    dirs = [found.dirpath] if found is not None else []
    if not dirs:
        raise ValueError(
            f"resume_from={resume_from!r} looks for the last.ckpt of a ModelCheckpoint callback, and this trainer "
            "has none: add ModelCheckpoint(dirpath, save_last=True) to callbacks=, or pass a checkpoint path."
        )
    path = os.path.join(dirs[0], "last.ckpt")
    if os.path.exists(path):
        return "last", f"resuming from {path}"
    return None, f"no {path} yet, starting fresh"


def resume_fit(trainer: LoopHost, resume_from: Any, plan: Plan) -> None:
    """``fit(resume_from=...)``: load the checkpoint, refusing first a saved schedule too short for ``plan``;
    nothing to load for :data:`CONTINUE` (``fit_more`` already put the run's state in place)."""
    from nbtrainer._resume import _checkpoint_state as _state

    if isinstance(resume_from, _InPlace):
        return
    _state.restore(trainer, resume_from, before_load=lambda ckpt: check_resume(trainer, plan, ckpt))


def check_resume(
    trainer: LoopHost, plan: Plan, ckpt: dict[str, Any], *, resume_hint: str = ", resume_from=..."
) -> None:
    """Refuse a checkpoint already past ``plan.epochs``; then :func:`check_schedule` for it (its scheduler,
    position and accumulation), before anything of it is loaded."""
    loop = ckpt.get("loop", {})
    check_position(trainer, plan, loop, ckpt=ckpt)
    at = int(loop.get("epoch", 0)) + 1  # the epoch the run is in, or the last one it completed
    if at > plan.epochs:
        done = completed_epochs(loop)
        raise ValueError(
            f"The checkpoint's run is at epoch {at} ({done} epoch(s) done), but this fit asks for epochs={plan.epochs} "
            f"in total: fit(epochs=N) counts the whole run, so {plan.epochs} < {at} leaves nothing to train. Pass "
            f"epochs={max(at, done + 1)} or more to continue the run, or use trainer.fit_more(train_loader, "
            "val_loader, epochs=N, resume_from=...) to train N more epochs."
        )
    state = ckpt.get("scheduler")
    if state is None:
        return
    config = ckpt.get("config", {})
    check_schedule(
        trainer,
        plan,
        scheduler_state=state,
        scheduler_class=config.get("scheduler") or type(trainer.scheduler).__name__,
        loop=ckpt["loop"],
        accum=int(config.get("grad_accum_steps", trainer.grad_accum_steps)),
        source="the checkpoint's",
        resume_hint=resume_hint,
    )


def _sizes(size: dict[str, Any]) -> str:
    batches, batch_size, samples = size.get("batches"), size.get("batch_size"), size.get("samples")
    text = f"{batches if batches is not None else '?'} batches"
    text += f" of {batch_size}" if batch_size is not None else ""
    return text + (f" ({samples} samples)" if samples is not None else "") + " an epoch"


def check_position(trainer: LoopHost, plan: Plan, loop: dict[str, Any], *, ckpt: dict[str, Any] | None = None) -> None:
    """Refuse to continue mid-epoch with a loader on which the saved position (a count of batches) would not mean
    the samples already trained on: another number of batches, batch size or samples per epoch. An epoch-boundary
    position fits any loader; a checkpoint without the loader's sizes is let through, as before they were saved, and
    so is one written by another number of processes (each rank's share differs: ``_this_rank`` warns of it)."""
    saved = loop.get("loader_size")
    batch = int(loop.get("batch", 0))
    if not saved or not batch or loop.get("epoch_complete", False):
        return
    if ckpt is not None and (len(ckpt.get("ranks") or []) or 1) != trainer.strategy.world_size:
        return
    from nbtrainer._data._order import loader_size
    from nbtrainer._resume._checkpoint_io import CheckpointError

    now = loader_size(trainer.strategy.prepare_loader(plan.train_loader, train=True))
    if any(saved.get(k) is not None and now[k] is not None and saved[k] != now[k] for k in now):
        setting = f"batch_size={saved['batch_size']}, " if saved.get("batch_size") is not None else ""
        raise CheckpointError(
            f"The run to continue is {batch} batch(es) into epoch {int(loop.get('epoch', 0)) + 1} of a training "
            f"loader of {_sizes(saved)}; this one has {_sizes(now)}: resumed on it, the rest of that epoch would not "
            "be the samples not yet trained on (some skipped, never trained). Resume with the original DataLoader "
            f"settings ({setting}the same dataset and sampler), or from a checkpoint saved at an epoch's end (any "
            "batch size continues from there)."
        )


def _install_fresh_schedule(trainer: LoopHost, factory: Any, plan: Plan) -> None:
    assert trainer.optimizer is not None  # fit_more goes through fit, which refuses a trainer without one
    _reset_for_fresh_schedule(trainer.optimizer)
    if factory is None:
        trainer.scheduler = None
        return
    loop = trainer.run_state.loop_state.state_dict()
    if trainer.options.step.scheduler_interval == "step":
        units = steps_left(loop, plan.batches(trainer), trainer.grad_accum_steps, plan.epochs, plan.max_steps)
        if units is None:
            raise TypeError(
                "fit_more: the train loader has no len(), so the extension's number of steps is unknown; pass "
                "max_steps= (the steps of the extension) to size the fresh schedule."
            )
    else:
        units = _epochs_left(loop, plan.epochs)
    sched = factory(trainer.optimizer, max(units, 1))
    if sched is not None and getattr(sched, "optimizer", None) is not trainer.optimizer:
        raise ValueError(
            "fit_more(scheduler=fn): fn must build the scheduler on the optimizer it is given "
            "(fn(optimizer, total_steps)), which is this trainer's optimizer."
        )
    trainer.scheduler = sched
