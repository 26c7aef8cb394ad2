"""Running a fit: ``Trainer.fit``, ``fit_more``, ``total_steps`` and the hooks the loop calls (mixed into
:class:`~nbtrainer.Trainer`).

``fit`` checks everything it can before the first batch (``_validate``), loads a checkpoint or starts fresh
(``_continue`` refuses a saved schedule too short for the run), hands the epochs to the loop (``_loop``) and
always ends through ``_end_fit`` (final read of the pending values, ``on_fit_end``, references dropped). An
out-of-memory error is turned into advice by ``_oom``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._events._history import History
from nbtrainer._events._progress import start_progress
from nbtrainer._loop import _oom
from nbtrainer._loop._control import is_plateau  # re-exported: _trainer.py imports it from here
from nbtrainer._loop._fit_loop import FitLoop, _safe_len
from nbtrainer._resume import _continue
from nbtrainer._setup._optim import move_optimizer_state
from nbtrainer._setup._seed import seed_everything, set_deterministic
from nbtrainer._trainer import _validate
from nbtrainer._trainer._base import TrainerBase
from nbtrainer._trainer._host import TrainerHost
from nbtrainer._trainer._interrupt import INTERRUPT_REASON, StopOnInterrupt, reraise_in_script, save_on_interrupt

__all__ = ["TrainerFit", "is_plateau"]


class TrainerFit(TrainerBase):
    """Mixin of :class:`~nbtrainer.Trainer` (its state is declared in :class:`TrainerBase`)."""

    def total_steps(self, train_loader: Any, epochs: int, *, batch_size: int | None = None) -> int:
        """Optimizer steps of ``fit(train_loader, epochs=epochs)``: ``ceil(batches / accum) * epochs``.

        ``train_loader`` may be arrays, as in :meth:`fit` (then with their ``batch_size``).

        Example:
            >>> # OneCycleLR(optimizer, max_lr=1e-2, total_steps=trainer.total_steps(loader, epochs=5))
        """
        train_loader = _arrays.as_loader(train_loader, batch_size=batch_size)
        n = _safe_len(self.strategy.prepare_loader(train_loader, train=True))  # this rank's share under DDP
        if n is None:
            raise TypeError("The loader has no len(); pass total_steps to your scheduler yourself.")
        return math.ceil(n / self.grad_accum_steps) * epochs

    # -- the three verbs -----------------------------------------------------------------------
    def fit(
        self,
        data: Any = None,
        val_loader: Any = None,
        epochs: int = 1,
        *,
        train_loader: Any = None,
        val_data: Any = None,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        max_steps: int | None = None,
        resume_from: str | None = None,
        profiler: Any = None,
    ) -> History:
        """Train; returns the :class:`History` (also when stopped; re-raises errors).

        Ctrl-C stops at the next optimizer step (a second one at once) and writes ``last.ckpt`` there when a
        ``ModelCheckpoint`` has ``save_on_interrupt`` (on with ``save_last``). Then, once the run is closed, a
        notebook gets the History marked ``interrupted``; a script gets the ``KeyboardInterrupt`` back (exit 130).

        Args:
            data: any iterable of batches (DataLoader, list...), or arrays like Keras: a tuple ``(x, y)`` /
                ``(x1, x2, y)`` or a dict of tensors or NumPy arrays, or one array, with ``batch_size``
                (NumPy float64 becomes float32). Arrays are batched by a seeded, resumable DataLoader.
            val_loader: validated every ``val_every_n_epochs``; keys get a ``val_`` prefix.
            epochs: total epochs (a resumed fit continues up to this number; to train N *more* epochs
                with a fresh LR schedule, use :meth:`fit_more`).
            train_loader: the same as ``data``, by its former name (``fit(train_loader=loader)`` keeps working).
            val_data: validation arrays (or a loader); the same ``batch_size``, never shuffled.
            batch_size: the batch size for array data (required with arrays, refused with loaders).
            shuffle: shuffle training arrays each epoch (default True).
            max_steps: end after this many optimizer steps in total (counted from the start of the run,
                also across resumes). Reaching it is a planned end: status ``"finished"``, with
                ``history.stop_reason`` saying ``max_steps=N reached``. ``Progress.epochs`` and the epoch
                bar count the epochs it reaches; an epoch it cuts short has its steps in ``history.steps``
                but no row in ``history.epochs`` (so a resume continues it exactly).
            resume_from: a checkpoint path or ``"last"`` (the ``last.ckpt`` of a ModelCheckpoint callback);
                ``"last-if-exists"`` (alias ``"auto"``, for preemptible jobs): that ``last.ckpt`` when there is
                one, else a fresh start, said in one progress line and a ``resume_from`` event. Refused before
                anything is loaded: a checkpoint already past ``epochs`` (use :meth:`fit_more` for more
                epochs) and a saved OneCycleLR too short for ``epochs``.
            profiler: a ``torch.profiler.profile``; phases get ``nbt.*`` ranges and ``step()`` is called.

        Example:
            >>> import torch
            >>> model = torch.nn.Linear(3, 2)
            >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", progress=False, seed=0)
            >>> x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
            >>> history = trainer.fit((x, y), val_data=(x[:16], y[:16]), batch_size=16, epochs=2)
            >>> len(history.epochs), "val_loss" in history.epochs[-1]
            (2, True)
        """
        if self.optimizer is None:
            raise _validate.no_optimizer("fit")
        if train_loader is not None and data is not None:
            raise TypeError("fit() got the training data twice (data and train_loader=): pass it once.")
        data = train_loader if data is None else data
        if data is None:
            raise TypeError("fit() needs training data: a DataLoader or list of batches, or arrays with batch_size=.")
        train_loader, val_loader = _arrays.fit_loaders(
            data, val_loader, val_data=val_data, batch_size=batch_size, shuffle=shuffle
        )
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be an int >= 1 or None, got {max_steps!r}.")
        run = self._run
        if run.fitting:
            raise RuntimeError(
                "This trainer is already fitting (in another thread?). Call request_stop() "
                "and wait for it to end before starting another fit."
            )
        n = _safe_len(train_loader)
        if n == 0:
            raise ValueError("train_loader is empty (len 0): check the dataset size, batch_size and drop_last.")
        if val_loader is not None and _safe_len(val_loader) == 0:
            raise ValueError("val_loader is empty (len 0): pass None to skip validation or fix the dataset.")
        run.has_validation = val_loader is not None
        _validate.check_fit(self._whole, train_loader, val_loader, epochs, max_steps)
        if self._budget is not None:  # planned for the first batch; nothing fits: a ValueError before any step
            self._budget.prepare(train_loader)
        control = self._live.requests
        control.reset()
        self._nonfinite.reset()
        plan = _continue.Plan(train_loader, epochs, max_steps)
        resume_note: tuple[str, str] | None = None
        if isinstance(resume_from, str) and resume_from in _continue.IF_EXISTS:
            requested = resume_from
            resume_from, note = _continue.resolve_if_exists(self._whole, resume_from)
            resume_note = (requested, note)
        if resume_from is not None:
            _continue.resume(self._whole, resume_from, plan)  # refuses a saved schedule too short for this fit
        else:
            _continue.check_schedule(self._whole, plan)  # e.g. a OneCycleLR a previous fit used up
            if self.seed is not None:
                seed_everything(self.seed)
            run.start_fresh()  # each fit gets its own History (the returned object)
        if self.deterministic:
            set_deterministic(True)
        self.model = self.strategy.setup_model(self.model)
        move_optimizer_state(self.optimizer, self.device)
        train_loader = self.strategy.prepare_loader(train_loader, train=True)
        if val_loader is not None:
            val_loader = self.strategy.prepare_loader(val_loader, train=False)
        n = _safe_len(train_loader)  # this rank's share under DDP
        self.progress = start_progress(run.loop_state, n, self.grad_accum_steps, epochs, max_steps)
        loop = FitLoop(TrainerHost(self._whole), train_loader, val_loader, epochs, max_steps, profiler)
        run.loop, run.fit_thread = loop, threading.get_ident()
        self._active.add(self)
        self.status = self.history.status = "running"
        self.history.stop_reason = None
        # Ctrl-C: the first one stops at the next optimizer step (_interrupt), a second one raises at once
        ctrl_c = StopOnInterrupt(control, enabled=not self.strategy.distributed)
        interrupted: BaseException | None = None
        try:
            # Hugging Face models build no key/value cache while training (nothing reads it; it only costs memory)
            with ctrl_c, no_cache(self.model):
                self.callbacks.call("on_fit_start", trainer=self)
                if self._budget is not None:  # what the plan chose (one progress line), then measure the first steps
                    self._budget.start()
                if resume_note is not None:  # say whether it resumed (one line in the progress, an event)
                    st = run.loop_state
                    event = {"step": st.global_step, "epoch": st.epoch + 1, "kind": "resume_from"}
                    self.callbacks.call(
                        "on_control", trainer=self, event={**event, "old": resume_note[0], "new": resume_note[1]}
                    )
                if val_loader is not None and resume_from is None:
                    # its first batch, now, under restored RNG; after on_fit_start, so a stateful compute_loss
                    # (reset by its callbacks) never sees a batch before the fit has started
                    _validate.check_val_loader(self._whole, val_loader)
                loop.run()
            st, reason = run.loop_state, control.stop_reason
            completed = st.epoch_complete and st.epoch + 1 >= epochs
            at_max_steps = (reason or "").startswith("max_steps")
            # A stop that lands after the last epoch (EarlyStopping firing at epoch N of N) changed nothing:
            # a normal finish, with no reason that would read as if the run had been cut short.
            if reason and (at_max_steps or not completed):
                self.history.stop_reason = reason
            if ctrl_c.received and not completed:
                self.status = "interrupted"
                self._save_on_interrupt()
            elif control.stop_requested and not completed and not at_max_steps:
                self.status = "stopped"
            else:
                self.status = "finished"
        except KeyboardInterrupt as exc:
            # Ctrl-C raised inside a step (a second Ctrl-C, or no handler could be installed): drop the
            # half-accumulated window; last.ckpt only when the loop was between optimizer steps.
            self.optimizer.zero_grad(set_to_none=True)
            self.status = "interrupted"
            self.history.stop_reason = INTERRUPT_REASON
            interrupted = exc
            if loop.at_step_boundary() and not self.strategy.distributed:
                self._save_on_interrupt()
        except BaseException as exc:
            self.status = "failed"
            self.history.stop_reason = f"{type(exc).__name__}: {exc}"
            self.history.status = "failed"
            self.optimizer.zero_grad(set_to_none=True)
            _oom.handle(self._whole, exc, "fit")  # out of memory: free the step's tensors, advice in the message
            try:
                self.callbacks.call("on_exception", trainer=self, exception=exc)
            finally:
                self._end_fit()
            raise
        self._end_fit()
        if interrupted is not None or ctrl_c.received:
            try:
                reraise_in_script(interrupted)  # a script stops (exit 130); a notebook gets the History
            finally:
                interrupted = None  # no frame holds the exception it raises
        return self.history

    def _save_on_interrupt(self) -> None:
        st = self._run.loop_state
        if st.global_step == 0:
            return  # nothing trained in this run yet: a checkpoint would only repeat the start
        for path in save_on_interrupt(self._whole):
            self.history.add_event(
                step=st.global_step, epoch=st.epoch + 1, kind="save_on_interrupt", old=None, new=path
            )

    def fit_more(
        self,
        train_loader: Iterable,
        val_loader: Iterable | None = None,
        *,
        epochs: int,
        resume_from: str | None = None,
        scheduler: str | Callable[[torch.optim.Optimizer, int], Any] | None = "keep",
        max_steps: int | None = None,
        profiler: Any = None,
    ) -> History:
        """Continue a run for ``epochs`` more epochs: after a finished or stopped ``fit`` of this trainer, or
        from a checkpoint (``resume_from=path | "last"``), optionally with a fresh LR schedule for them.

        Epoch numbers, the global step and the History continue (the History gets a ``fit_more`` event
        where the extension starts); a run stopped mid-epoch first finishes that epoch, which counts as
        the first of the ``epochs`` more.

        Args:
            train_loader / val_loader: as for :meth:`fit`.
            epochs: how many epochs *more* (the run ends at epochs done + ``epochs``).
            resume_from: a checkpoint of the run to continue (default: this trainer's own state).
            scheduler: ``"keep"`` (default) continues the run's scheduler, refused before any step when it
                cannot cover the extension (a OneCycleLR ends where it was built to end); a function
                ``fn(optimizer, total_steps) -> scheduler`` builds a fresh one for the extension, called
                after the state is loaded with the extension's optimizer steps (epochs when
                ``scheduler_interval="epoch"``) and the optimizer's LRs back at the run's reference LR
                (OneCycle's ``max_lr``, else where the old schedule started); ``None``: no schedule, that
                reference LR constant.
            max_steps: optimizer steps of the extension at most.
            profiler: as for :meth:`fit`.

        Example:
            >>> import torch
            >>> from torch.optim.lr_scheduler import OneCycleLR
            >>> model = torch.nn.Linear(3, 1)
            >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
            >>> trainer = Trainer(model, torch.nn.MSELoss(), opt, progress=False, seed=0)
            >>> trainer.set_scheduler(OneCycleLR(opt, max_lr=0.1, total_steps=trainer.total_steps(data, 2)))
            >>> len(trainer.fit(data, epochs=2))
            2
            >>> more = trainer.fit_more(data, epochs=3,  # epochs 3-5, on a fresh one-cycle of their own
            ...     scheduler=lambda optimizer, steps: OneCycleLR(optimizer, max_lr=0.05, total_steps=steps))
            >>> [row["epoch"] for row in more], more.status
            ([1, 2, 3, 4, 5], 'finished')
        """
        return _continue.fit_more(
            self._whole,
            train_loader,
            val_loader,
            epochs=epochs,
            resume_from=resume_from,
            scheduler=scheduler,
            max_steps=max_steps,
            profiler=profiler,
        )

    def _end_fit(self) -> None:
        run = self._run
        if run.loop is not None:
            try:
                run.loop.flush()
            except Exception:
                pass
            run.elapsed_before += run.loop.fit_elapsed()
            run.loop.read_memory()  # the last window (validation, the final steps) counts in the fit's peak
        self.history.status = self.status
        self.progress.status = self.status
        self._live.drop_deferred()
        try:
            self.callbacks.call("on_fit_end", trainer=self, history=self.history)
        finally:
            run.loop = run.fit_thread = None  # drop references to batches/outputs held by the loop
            self._active.discard(self)
            self.strategy.barrier()
