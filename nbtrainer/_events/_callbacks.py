"""Callbacks: the optional base class, EarlyStopping, LRMonitor and the history recorder.

Subclassing :class:`Callback` is optional: any object with some of the hook methods listed in
``nbtrainer.EVENTS`` works; a hook is called only if the object defines it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._events._history import group_lr_key
from nbtrainer._events._stream import Progress
from nbtrainer._report._format import format_number
from nbtrainer._report._html import resolve_mode

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["Callback", "EarlyStopping", "HistoryRecorder", "LRMonitor", "resolve_mode"]


def no_validation_hint(key: str, trainer: TrainerView) -> str:
    """Why a ``val_`` key is never logged, when the fit does not validate (else empty)."""
    if not key.startswith("val_") or trainer.has_validation:
        return ""
    every = trainer.options.run.val_every_n_epochs
    if every == 1:
        return " (no val_loader was given to fit())"
    return f" (no val_loader was given to fit(), or val_every_n_epochs={every} is more than the fit's epochs)"


def check_monitor(owner: str, monitor: str, trainer: TrainerView) -> None:
    """Refuse, before the first step, to monitor a key the fit will never log."""
    keys = trainer.expected_log_keys()
    if monitor not in keys:
        hint = no_validation_hint(monitor, trainer)
        raise ValueError(
            f"{owner} monitors {monitor!r}, which this fit will never log{hint}. "
            f"Logged keys: {sorted(keys)}. Pick one of them."
        )


class Callback:
    """Base class with no-op hooks, for discoverability; duck-typed objects work too.

    Example:
        >>> class Print(Callback):
        ...     def on_epoch_end(self, trainer, epoch, logs):
        ...         print(epoch, round(logs["loss"], 2))
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class EarlyStopping(Callback):
    """Stop when a monitored value stops improving.

    Args:
        monitor: a key of the epoch logs (``"val_loss"``, ``"val_acc"``, ...). An epoch that does not log it
            (validation every n epochs: ``val_every_n_epochs``) is skipped: patience counts the epochs that do.
        mode: ``"min"``, ``"max"`` or ``"auto"``: max for accuracy-like names (``val_acc``, ``val_f1``), min for
            the rest and for any name of a loss or an error (``val_dice_loss``, ``val_mape``; see
            ``nbtrainer.plotting.higher_is_better``).
        patience: epochs without improvement before stopping.
        min_delta: the smallest change that counts as an improvement (the thresholds below compare the value itself).
        check_finite: stop when the value is NaN or inf.
        stopping_threshold: stop as soon as the value is at least this good.
        divergence_threshold: stop as soon as the value is worse than this.
        restore_best_weights: load the best epoch's weights back at the end of the fit.

    Example:
        >>> es = EarlyStopping(monitor="val_loss", patience=2)
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        *,
        mode: str = "auto",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        restore_best_weights: bool = False,
    ) -> None:
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(f"patience must be an int >= 0, got {patience!r}.")
        self.monitor = monitor
        self.mode = resolve_mode(monitor, mode)
        self.patience = patience
        self.min_delta = abs(min_delta)
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.restore_best_weights = restore_best_weights
        self._start_over()

    def _start_over(self) -> None:
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None
        self._best_weights: dict[str, torch.Tensor] | None = None

    def _better(self, value: float, ref: float | None) -> bool:
        if ref is None:
            return True
        return value < ref - self.min_delta if self.mode == "min" else value > ref + self.min_delta

    def _at_least_as_good(self, value: float, threshold: float) -> bool:
        return value <= threshold if self.mode == "min" else value >= threshold

    def on_fit_start(self, trainer: TrainerView) -> None:
        check_monitor("EarlyStopping", self.monitor, trainer)
        if trainer.fresh_fit:  # a new run is judged on its own epochs; fit_more and a resume carry the state on
            self._start_over()

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            # An epoch that does not log it (no validation under val_every_n_epochs > 1) is not judged, nor counted
            # in the patience; a key the fit never logs was refused at on_fit_start.
            return
        value = float(logs[self.monitor])
        reason = None
        if self.check_finite and not math.isfinite(value):
            reason = f"{self.monitor} is {value}"
        else:
            improved = self._better(value, self.best)
            if improved:
                self.best, self.best_epoch, self.wait = value, epoch, 0
                if self.restore_best_weights:
                    weights = trainer.model_state_dict().items()
                    self._best_weights = {k: v.detach().to("cpu", copy=True) for k, v in weights}
            else:
                self.wait += 1
            # The thresholds judge the value itself: min_delta says only what counts as an improvement.
            if self.stopping_threshold is not None and self._at_least_as_good(value, self.stopping_threshold):
                reason = (
                    f"{self.monitor}={format_number(value)} reached "
                    f"stopping_threshold={format_number(self.stopping_threshold)}"
                )
            elif (
                self.divergence_threshold is not None
                and math.isfinite(value)
                and not self._at_least_as_good(value, self.divergence_threshold)
            ):
                reason = (
                    f"{self.monitor}={format_number(value)} is worse than "
                    f"divergence_threshold={format_number(self.divergence_threshold)}"
                )
            elif not improved and self.wait >= self.patience:
                reason = (
                    f"{self.monitor} did not improve for {self.wait} epochs "
                    f"(best {format_number(self.best)} at epoch {self.best_epoch})"
                )
        if reason is not None:
            self.stopped_epoch = epoch
            trainer.request_stop(f"EarlyStopping: {reason}")

    def on_fit_end(self, trainer: TrainerView, history: Any) -> None:
        if history.status == "failed" and trainer.strategy.shards_parameters:
            return  # loading sharded weights is a collective that peers stuck elsewhere would never join
        if self.restore_best_weights and self._best_weights is not None:
            trainer.load_model_state_dict(self._best_weights)
            history.add_event(
                step=trainer.global_step,
                epoch=self.best_epoch,
                kind="restore_best_weights",
                old=None,
                new=self.best_epoch,
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "wait": self.wait,
            "stopped_epoch": self.stopped_epoch,
            "best_weights": self._best_weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state.get("best"), state.get("best_epoch")
        self.wait, self.stopped_epoch = state.get("wait", 0), state.get("stopped_epoch")
        self._best_weights = state.get("best_weights")


class LRMonitor(Callback):
    """Adds the learning rate of every param group to the epoch logs (``lr_group{i}``): the LRs the epoch's
    last step used, as ``lr`` (before a per-step scheduler moved them on; an epoch scheduler steps after
    ``on_epoch_end``).

    Example:
        >>> monitor = LRMonitor()  # Trainer(..., callbacks=[monitor]); history["lr_group0"]
    """

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        # the loop's record of the last step, not the groups: a per-step scheduler has already moved those on
        lrs = trainer.progress.step_lrs
        if not lrs and trainer.optimizer is not None:
            lrs = [float(group["lr"]) for group in trainer.optimizer.param_groups]
        for i, lr in enumerate(lrs):
            logs[group_lr_key(i)] = lr


class HistoryRecorder:
    """Feeds the History from the event stream (always the trainer's first callback)."""

    def __init__(self, history: Any) -> None:
        self.history = history

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        if progress.step_points:
            self.history.add_steps(progress.step_points, progress.epoch, progress.step_group_lrs)

    def on_control(self, trainer: TrainerView, event: dict[str, Any]) -> None:
        self.history.add_event(**event)

    def on_health(self, trainer: TrainerView, report: Any) -> None:
        self.history.add_health(report.to_dict())

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        self.history.add_epoch(logs)
