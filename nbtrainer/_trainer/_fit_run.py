"""One ``Trainer.fit`` call, from its arguments to the status it ends with: :func:`check_fit_args`, then
:class:`FitRun`'s :meth:`~FitRun.begin` (a resume or a fresh start, the model placed, the loop built),
:meth:`~FitRun.run` (the callbacks told, the loop run, the status decided, a failure handled) and
:meth:`~FitRun.end` (the loop's last data flushed, ``on_fit_end``, the references to the run's tensors dropped).

The loop itself is ``nbtrainer._loop._fit_loop.FitLoop``; Ctrl-C is ``_interrupt``; continuing a run (``fit_more``,
``resume_from=``) is ``nbtrainer._resume._continue``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from nbtrainer._data import _arrays
from nbtrainer._data._batch import safe_len
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._data._validate_batch import explain_late_label
from nbtrainer._events._progress import start_progress
from nbtrainer._loop import _oom
from nbtrainer._loop._fit_loop import FitLoop
from nbtrainer._resume import _continue
from nbtrainer._setup._optim import move_optimizer_state
from nbtrainer._setup._seed import seed_everything, set_deterministic
from nbtrainer._trainer import _validate
from nbtrainer._trainer._interrupt import INTERRUPT_REASON, StopOnInterrupt, reraise_in_script, save_on_interrupt

if TYPE_CHECKING:
    from nbtrainer._events._history import History
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._trainer._memory_budget import MemoryBudget

__all__ = ["FitParts", "FitRun", "check_fit_args"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FitParts:
    """The parts of a Trainer that only its fits use (``Trainer.fit`` hands them over): the live control, the NaN/inf
    gate, the memory budget, and the set of trainers fitting in this process."""

    live: LiveControl
    nonfinite: NonFiniteGuard
    budget: MemoryBudget | None
    active: weakref.WeakSet[Any]


def check_fit_args(
    trainer: LoopHost,
    data: Any,
    val_loader: Any,
    epochs: Any,
    *,
    train_loader: Any,
    val_data: Any,
    batch_size: int | None,
    shuffle: bool | None,
    max_steps: Any,
) -> tuple[Any, Any]:
    """``fit``'s arguments, checked before anything runs: the data (arrays batched into loaders), ``epochs``,
    ``max_steps``, a fit already running, empty loaders, then what this fit will log (``_validate.check_fit``).
    Returns ``(train_loader, val_loader)``."""
    if train_loader is not None and data is not None:
        raise TypeError("fit() got the training data twice (data and train_loader=): pass it once.")
    data = train_loader if data is None else data
    if data is None:
        raise TypeError("fit() needs training data: a DataLoader or list of batches, or arrays with batch_size=.")
    if trainer.run_state.fitting:
        raise RuntimeError(
            "This trainer is already fitting (in another thread?). Call request_stop() "
            "and wait for it to end before starting another fit."
        )
    trainer.run_state.called_at = time.monotonic()  # a stop from here on is this fit's (begin() keeps it)
    train, val = _arrays.fit_loaders(data, val_loader, val_data=val_data, batch_size=batch_size, shuffle=shuffle)
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be an int >= 1 or None, got {max_steps!r}.")
    if safe_len(train) == 0:
        raise ValueError("train_loader is empty (len 0): check the dataset size, batch_size and drop_last.")
    if val is not None and safe_len(val) == 0:
        raise ValueError("val_loader is empty (len 0): pass None to skip validation or fix the dataset.")
    # validates at all: an epoch that is a multiple of val_every_n_epochs (a fit shorter than that never validates,
    # and what monitors a val_ key is refused below rather than never fed)
    trainer.run_state.has_validation = val is not None and epochs >= trainer.options.run.val_every_n_epochs
    _validate.check_fit(trainer, train, val, epochs, max_steps)
    return train, val


class FitRun:
    """One fit of ``trainer`` (see the module docstring): built by ``Trainer.fit`` once its arguments are checked."""

    def __init__(
        self, trainer: LoopHost, parts: FitParts, train_loader: Any, val_loader: Any, epochs: int, max_steps: int | None
    ) -> None:
        self.trainer, self.parts, self.epochs, self.max_steps = trainer, parts, epochs, max_steps
        self.train_loader, self.val_loader = train_loader, val_loader
        self.resume_from: Any = None
        self.resume_note: tuple[str, str] | None = None  # (what was asked, what was done): one line and an event
        self.accum_note: tuple[int, int] | None = None  # (this trainer's, the checkpoint's) when they differ
        self.loop: FitLoop | None = None

    def begin(self, resume_from: Any, profiler: Any) -> None:
        """Plan (``memory_budget_gb``), resume or start fresh, place the model and the loaders, build the loop."""
        trainer, parts = self.trainer, self.parts
        run = trainer.run_state
        if parts.budget is not None:  # planned for the first batch; nothing fits: a ValueError before any step
            parts.budget.prepare(self.train_loader)
        parts.live.requests.reset(keep_stop_since=run.called_at)
        parts.nonfinite.reset()
        plan = _continue.Plan(self.train_loader, self.epochs, self.max_steps)
        if isinstance(resume_from, str) and resume_from in _continue.IF_EXISTS:
            requested = resume_from
            resume_from, note = _continue.resolve_if_exists(trainer, resume_from)
            self.resume_note = (requested, note)
        self.resume_from = resume_from
        if resume_from is not None:
            accum = trainer.grad_accum_steps
            _continue.resume_fit(trainer, resume_from, plan)  # refuses a saved schedule too short for this fit
            if trainer.grad_accum_steps != accum:
                self.accum_note = (accum, trainer.grad_accum_steps)
                _warn_accumulation(accum, trainer.grad_accum_steps)
        else:
            _continue.check_schedule(trainer, plan)  # e.g. a OneCycleLR a previous fit used up
            seed = trainer.options.run.seed
            if seed is not None:
                seed_everything(seed)
            run.start_fresh()  # each fit gets its own History (the returned object)
        trainer.fresh_fit = resume_from is None  # the callbacks' on_fit_start reads it: start over, or carry on
        run.loop_state.fit_epochs, run.loop_state.fit_max_steps = self.epochs, self.max_steps  # kept after the fit
        if trainer.options.run.deterministic:
            set_deterministic(True)
        trainer.model = trainer.strategy.setup_model(trainer.model)
        move_optimizer_state(self._optimizer(), trainer.device)
        train = trainer.strategy.prepare_loader(self.train_loader, train=True)
        if self.val_loader is not None:
            self.val_loader = trainer.strategy.prepare_loader(self.val_loader, train=False)
        n = safe_len(train)  # this rank's share under DDP
        if n == 0 and trainer.strategy.distributed:
            # every rank's training share has the same length (a padded DistributedSampler, an equal share of a
            # list), so every rank refuses here alike, before any collective
            raise ValueError(_empty_shard(train, trainer.strategy.world_size))
        trainer.progress = start_progress(run.loop_state, n, trainer.grad_accum_steps, self.epochs, self.max_steps)
        loop = FitLoop(
            trainer,
            train,
            self.val_loader,
            self.epochs,
            self.max_steps,
            profiler,
            live=parts.live,
            nonfinite=parts.nonfinite,
        )
        self.loop = loop
        run.loop, run.fit_thread = loop, threading.get_ident()
        parts.active.add(trainer)
        trainer.status = trainer.history.status = "running"
        trainer.history.stop_reason = None

    def run(self) -> History:
        """Run the loop between ``on_fit_start`` and ``on_fit_end``; the status says how it ended."""
        trainer, loop = self.trainer, self.loop
        assert loop is not None  # begin() built it
        control = self.parts.live.requests
        # Ctrl-C: the first one stops at the next optimizer step (_interrupt), a second one raises at once
        ctrl_c = StopOnInterrupt(control, enabled=not trainer.strategy.distributed)
        interrupted: BaseException | None = None
        try:
            # Hugging Face models build no key/value cache while training (nothing reads it; it only costs memory)
            with ctrl_c, no_cache(trainer.model):
                self._start()
                loop.run()
            self._finish(ctrl_c.received)
        except KeyboardInterrupt as exc:
            # Ctrl-C raised inside a step (a second Ctrl-C, or no handler could be installed): drop the
            # half-accumulated window; last.ckpt only when the loop was between optimizer steps.
            self._optimizer().zero_grad(set_to_none=True)
            trainer.status = "interrupted"
            trainer.history.stop_reason = INTERRUPT_REASON
            interrupted = exc
            if loop.at_step_boundary() and not trainer.strategy.distributed:
                save_on_interrupt(trainer)
        except BaseException as exc:
            trainer.status = trainer.history.status = "failed"
            trainer.history.stop_reason = f"{type(exc).__name__}: {exc}"
            self._optimizer().zero_grad(set_to_none=True)
            _oom.handle(trainer, exc, "fit")  # out of memory: free the step's tensors, advice in the message
            explain_late_label(exc, epoch=loop.state.epoch + 1, step=trainer.global_step)
            try:
                trainer.callbacks.call("on_exception", trainer=trainer, exception=exc)
            finally:
                self.end()
            raise
        self.end()
        if interrupted is not None or ctrl_c.received:
            try:
                reraise_in_script(interrupted)  # a script stops (exit 130); a notebook gets the History
            finally:
                interrupted = None  # no frame holds the exception it raises
        return trainer.history

    def _optimizer(self) -> Any:
        optimizer = self.trainer.optimizer
        assert optimizer is not None  # fit refuses a trainer without one before a run exists
        return optimizer

    def _start(self) -> None:
        trainer, run = self.trainer, self.trainer.run_state
        trainer.callbacks.call("on_fit_start", trainer=trainer)
        if self.parts.budget is not None:  # what the plan chose (one progress line), then measure the first steps
            self.parts.budget.start()
        if self.resume_from is None and trainer.options.run.check_data:  # labels past the outputs: refused here
            from nbtrainer._know._check import check_at_fit

            check_at_fit(trainer, trainer.options.run.check_data, self.train_loader, self.val_loader)
        if self.resume_note is not None:  # say whether it resumed (one line in the progress, an event)
            st = run.loop_state
            event = {"step": st.global_step, "epoch": st.epoch + 1, "kind": "resume_from"}
            old, new = self.resume_note
            trainer.callbacks.call("on_control", trainer=trainer, event={**event, "old": old, "new": new})
        if self.accum_note is not None:  # the checkpoint's accumulation replaced this trainer's: an event
            st = run.loop_state
            own, saved = self.accum_note
            event = {"step": st.global_step, "epoch": st.epoch + 1, "kind": "grad_accum_steps", "old": own}
            trainer.callbacks.call("on_control", trainer=trainer, event={**event, "new": saved, "source": "checkpoint"})
        if self.val_loader is not None and self.resume_from is None:
            # its first batch, now, under restored RNG; after on_fit_start, so a stateful compute_loss
            # (reset by its callbacks) never sees a batch before the fit has started
            trainer.batch_steps.check_val_loader(self.val_loader)

    def _finish(self, interrupted: bool) -> None:
        """The status of a loop that returned: finished, stopped (a request), or interrupted (Ctrl-C)."""
        trainer = self.trainer
        if self.parts.budget is not None:  # a fit shorter than the budget's check: what it measured, one line
            self.parts.budget.finish()
        control = self.parts.live.requests
        st, reason = trainer.run_state.loop_state, control.stop_reason
        # on_nonfinite="stop" saw a NaN/inf loss: the run did not end as planned, even when the loss was only read
        # at the last epoch's end (after its steps ran), or when another stop had been asked for first
        nonfinite = self.parts.nonfinite.stop_reason
        if nonfinite is not None:
            reason = nonfinite
        completed = st.epoch_complete and st.epoch + 1 >= self.epochs and nonfinite is None
        at_max_steps = (reason or "").startswith("max_steps")
        # A stop that lands after the last epoch (EarlyStopping firing at epoch N of N) changed nothing:
        # a normal finish, with no reason that would read as if the run had been cut short.
        if reason and (at_max_steps or not completed):
            trainer.history.stop_reason = reason
        if interrupted and not completed:
            trainer.status = "interrupted"
            save_on_interrupt(trainer)
        elif control.stop_requested and not completed and not at_max_steps:
            trainer.status = "stopped"
        else:
            trainer.status = "finished"

    def end(self) -> None:
        """Close the run: the loop's last data flushed (a failure there is the user's data: it is raised after the
        run is closed), the status on the History, ``on_fit_end``, and no reference left to the run's tensors."""
        trainer = self.trainer
        run = trainer.run_state
        loop = run.loop
        flush_error: Exception | None = None
        if loop is not None:
            try:
                loop.flush()
            except Exception as exc:  # raised below, once every callback has seen the end
                flush_error = exc
                log.debug("the loop's final flush failed; raised after on_fit_end", exc_info=True)
            run.elapsed_before += loop.fit_elapsed()
            loop.read_memory()  # the last window (validation, the final steps) counts in the fit's peak
        trainer.history.status = trainer.status
        trainer.progress.status = trainer.status
        self.parts.live.drop_deferred()
        try:
            trainer.callbacks.call("on_fit_end", trainer=trainer, history=trainer.history)
        finally:
            run.loop = run.fit_thread = None  # drop references to batches/outputs held by the loop
            self.parts.active.discard(trainer)
            # A change or call asked for after the last step boundary (during the last validation) has no boundary
            # left to wait for: without this the LR / accumulation shown was never trained with, and a save waited
            # for ever. Applied as between fits; a request from here on applies itself (the fit is over).
            self.parts.live.apply()
            # A failed rank skips the barrier: its peers may be waiting in another collective (a gradient
            # all-reduce) and would never reach it, so both would hang and the error would never show; the
            # exception propagates instead and the launcher ends the other ranks.
            if trainer.status != "failed":
                trainer.strategy.barrier()
        if flush_error is not None and trainer.status != "failed":
            raise flush_error


def _empty_shard(loader: Any, world_size: int) -> str:
    """Why a training loader that is not empty yields no batch on each of ``world_size`` ranks, and what to change."""
    sampler, size = getattr(loader, "sampler", None), getattr(loader, "batch_size", None)
    share = safe_len(sampler) if sampler is not None else None
    if share is None or size is None:
        return (
            f"train_loader: each of the {world_size} ranks gets no batch to train on (the data is shared out "
            "between the ranks). Pass more data, or fewer / smaller batches."
        )
    return (
        f"train_loader: each of the {world_size} ranks gets {share} sample(s), fewer than batch_size={size} with "
        f"drop_last=True, so no rank has a batch to train on. Pass batch_size <= {share} (or drop_last=False)."
    )


def _warn_accumulation(own: int, saved: int) -> None:
    """A resume keeps the checkpoint's accumulation over the trainer's own (exact resume needs it): said, once."""
    import warnings

    warnings.warn(
        f"resume_from: the checkpoint was written with grad_accum_steps={saved}, this trainer has "
        f"grad_accum_steps={own}; the run continues with {saved}, as it was saved (its position inside the "
        f"accumulation window and its schedule count on it). Build the Trainer with grad_accum_steps={saved} to "
        "resume as saved without this warning, or call trainer.set_grad_accum_steps(k) during the fit to change it "
        "(applied at the next optimizer step, recorded in history.events).",
        stacklevel=6,  # the user's fit() call
    )
