"""The Trainer's control surface: thread-safe stop / pause / LR and accumulation changes, and setters between
fits (mixed into :class:`~nbtrainer.Trainer`).

Calls from other threads only queue a request; the Trainer's :class:`~nbtrainer._trainer._live_control.LiveControl`
applies it on the training thread at the next optimizer-step boundary and records it as an ``on_control`` event,
so the history shows every change where it took effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from nbtrainer._loop._control import lr_parts
from nbtrainer._setup._precision import make_scaler, require_precision
from nbtrainer._trainer import _validate
from nbtrainer._trainer._base import TrainerBase

__all__ = ["TrainerControl"]


class TrainerControl(TrainerBase):
    """Mixin of :class:`~nbtrainer.Trainer` (its state is declared in :class:`TrainerBase`)."""

    # -- control from any thread ---------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop at the next optimizer-step boundary (thread-safe); ``fit`` returns normally."""
        self._live.requests.request_stop(reason)

    def pause(self) -> None:
        """Hold at the next optimizer-step boundary until :meth:`resume` (thread-safe)."""
        self._live.requests.pause()

    def resume(self) -> None:
        self._live.requests.resume()

    def set_lr(self, lr: float, optimizer: str | None = None, *, source: str | None = None) -> None:
        """Set the (reference) learning rate at the next optimizer step; schedules are rescaled. With several
        named optimizers, ``optimizer="name"`` sets that one's (without: each gets ``lr``).

        ``source`` says who changed it (the panel passes ``"typed"``, ``"dragged"`` or ``"lr finder"``): it is
        kept on the ``lr`` event (``event["source"]``), and the panel labels the change's marker with it."""
        if self.optimizer is None:
            raise _validate.no_optimizer("set_lr")
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive finite number, got {lr!r}.")
        if source is not None and not isinstance(source, str):
            raise TypeError(f"source must be a short string (e.g. 'typed') or None, got {source!r}.")
        lr_parts(self.optimizer, self.scheduler, optimizer)  # an unknown name is refused now, not at the step
        pending = dict(self._live.requests.peek("lr") or {})
        pending[optimizer] = (float(lr), source)
        self._live.apply_or_queue("lr", pending)

    def set_grad_accum_steps(self, steps: int) -> None:
        """Change accumulation at the next optimizer-step boundary (thread-safe)."""
        _validate.check_accum(steps)
        _validate.check_in_backward_now(self._whole, grad_accum_steps=int(steps))
        self._check_closure(grad_accum_steps=int(steps))
        self._live.apply_or_queue("grad_accum_steps", int(steps))

    def add_callback(self, callback: Any) -> None:
        """Attach a callback (any object with some ``nbtrainer.EVENTS`` hooks); also mid-fit."""
        _validate.check_callback(callback)
        _validate.check_in_backward_now(self._whole, callbacks=[*self.callbacks.callbacks, callback])
        self.callbacks.append(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callbacks.remove(callback)

    def _check_closure(self, **changed: Any) -> None:
        from nbtrainer._loop._closure import check_closure

        settings: dict[str, Any] = {
            "grad_accum_steps": self.grad_accum_steps,
            "precision": self.precision,
            "optimizer_in_backward": self.optimizer_in_backward,
            "on_nonfinite": self._nonfinite.mode,
            "memory_budget": self._budget is not None,
        }
        check_closure(self.optimizer, **{**settings, **changed})

    def _require_idle(self, what: str) -> None:
        if self._run.fitting:
            raise RuntimeError(f"{what} cannot change while fit() is running; stop the run first.")

    def set_precision(self, precision: str) -> None:
        """Change precision between fits (checked against the device; never silently downgraded)."""
        self._require_idle("precision")
        checked = require_precision(precision, self.device)
        _validate.check_in_backward_now(self._whole, precision=checked)
        self._check_closure(precision=checked)
        self.precision = checked
        self.scaler = make_scaler(self.precision, self.device)

    def set_scheduler(self, scheduler: Any, interval: str = "step") -> None:
        """Replace the LR scheduler between fits (``None`` removes it)."""
        self._require_idle("The scheduler")
        if scheduler is not None and self.optimizer is None:
            raise _validate.no_optimizer("A scheduler")
        if scheduler is not None and getattr(scheduler, "optimizer", self.optimizer) is not self.optimizer:
            raise ValueError("The scheduler is bound to a different optimizer; build it from trainer.optimizer.")
        if interval not in ("step", "epoch"):
            raise ValueError(f"interval must be 'step' or 'epoch', got {interval!r}.")
        self.scheduler, self.scheduler_interval = scheduler, interval

    def set_activation_checkpointing(self, value: Any) -> list[str]:
        """Activation checkpointing between fits: ``True``, a list of module types / names, or ``False``
        (the model is restored exactly). Returns the checkpointed blocks."""
        self._require_idle("activation_checkpointing")
        return self._setup.set_activation_checkpointing(value)

    @property
    def checkpointed_blocks(self) -> list[str]:
        """The blocks under activation checkpointing now (empty when it is off)."""
        return self._setup.checkpointed_blocks

    @property
    def param_counts(self) -> Any:
        """Trainable / frozen parameter counts of the model (``str()`` gives one line)."""
        return self._setup.param_counts()

    def lr_find(
        self, train_loader: Iterable, min_lr: float = 1e-7, max_lr: float = 10.0, steps: int = 100, **kwargs: Any
    ) -> Any:
        """LR range test (exponential sweep); model and optimizer are restored afterwards. See
        :func:`nbtrainer._loop._lr_find.lr_find` for the options and the :class:`LRFinderResult`."""
        from nbtrainer._loop._lr_find import lr_find

        if self.optimizer is None:
            raise _validate.no_optimizer("lr_find")
        from nbtrainer._trainer._host import TrainerHost

        host = TrainerHost(self._whole)
        return lr_find(self._whole, train_loader, min_lr=min_lr, max_lr=max_lr, steps=steps, host=host, **kwargs)

    def set_max_grad_norm(self, max_grad_norm: float | None) -> None:
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}.")
        _validate.check_in_backward_now(self._whole, max_grad_norm=max_grad_norm)
        self.max_grad_norm = max_grad_norm

    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once the current event has reached every callback (used for checkpoint saves)."""
        self._live.defer(fn)
