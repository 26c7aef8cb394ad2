"""The Trainer as the fit loop sees it: :class:`TrainerHost` implements ``nbtrainer._loop._host.LoopHost``.

The loop is typed against the Protocol and never touches the Trainer's private state; this adapter is the one
place that maps the Protocol onto the Trainer (its configuration, the state its mixins share, the steps of the
batch protocol). A property reads the Trainer at the moment of use, so a change between steps (accumulation,
clipping, a resumed state) is seen at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._loop._control import step_epoch_scheduler
from nbtrainer._trainer import _validate

if TYPE_CHECKING:
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._loop._control import Control
    from nbtrainer._loop._fit_loop import LoopState
    from nbtrainer._loop._metrics import MetricSet
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["TrainerHost"]


class TrainerHost:
    """``LoopHost`` over a :class:`~nbtrainer.Trainer` (``owner``)."""

    __slots__ = ("owner",)

    def __init__(self, trainer: Trainer) -> None:
        self.owner = trainer

    # -- the run's objects ------------------------------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        return self.owner.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        opt = self.owner.optimizer
        assert opt is not None  # fit refuses a trainer without one before a loop exists
        return opt

    @property
    def scheduler(self) -> Any:
        return self.owner.scheduler

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.owner.scaler

    @property
    def criterion(self) -> Any:
        return self.owner.criterion

    @property
    def device(self) -> torch.device:
        return self.owner.device

    @property
    def strategy(self) -> Any:
        return self.owner.strategy

    @property
    def callbacks(self) -> CallbackList:
        return self.owner.callbacks

    @property
    def progress(self) -> Progress:
        return self.owner.progress

    @property
    def history(self) -> History:
        return self.owner.history

    @property
    def state(self) -> LoopState:
        return self.owner.run_state.loop_state

    @property
    def control(self) -> Control:
        return self.owner._live.requests

    @property
    def train_metrics(self) -> MetricSet:
        return self.owner.run_state.train_metrics

    @property
    def nonfinite(self) -> NonFiniteGuard:
        return self.owner._nonfinite

    @property
    def params(self) -> list[torch.Tensor]:
        return self.owner._params

    # -- settings -----------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return self.owner.status

    @property
    def grad_accum_steps(self) -> int:
        return self.owner.grad_accum_steps

    @property
    def training_step(self) -> Any:
        return self.owner.batch_steps.training_step_fn

    @property
    def deterministic(self) -> bool:
        return self.owner.deterministic

    @property
    def micro_split(self) -> int:
        return self.owner.micro_split

    @property
    def max_grad_norm(self) -> float | None:
        return self.owner.max_grad_norm

    @property
    def optimizer_in_backward(self) -> bool:
        return self.owner.optimizer_in_backward

    @property
    def timing_every(self) -> int:
        return self.owner.timing_every

    @property
    def refresh_interval(self) -> float:
        return self.owner.refresh_interval

    @property
    def val_every_n_epochs(self) -> int:
        return self.owner.val_every_n_epochs

    @property
    def non_blocking(self) -> bool:
        return self.owner.non_blocking

    @property
    def fast_fetch(self) -> bool:
        return self.owner.fast_fetch

    @property
    def data_on_device(self) -> float:
        return self.owner.data_on_device

    @property
    def scheduler_per_step(self) -> bool:
        return self.owner._scheduler_per_step

    @property
    def elapsed_before(self) -> float:
        return self.owner.run_state.elapsed_before

    # -- what the loop asks of the Trainer --------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.owner.batch_steps.autocast()

    def default_compute(self) -> bool:
        return self.owner.batch_steps.default_compute()

    def first_compute(self, batch: Any) -> tuple[Any, Any, Any]:
        """The first micro-batch of a fresh fit: computed in stages with clear errors, metrics tried."""
        loss, outputs, targets = _validate.first_compute(self.owner, batch)
        metrics = self.owner.run_state.train_metrics
        if metrics:
            with torch.no_grad():
                _validate.dry_metrics(self.owner, metrics, outputs, targets, "training")
        return loss, outputs, targets

    def check_first_loss(self, loss: Any, outputs: Any, targets: Any) -> None:
        _validate.check_loss(self.owner, loss, "training", needs_grad=True)

    def compute(self, batch: Any) -> tuple[Any, Any, Any]:
        return self.owner.batch_steps.compute(batch)

    def evaluate(self, batches: Iterable[Any], prefix: str) -> dict[str, float]:
        return self.owner.batch_steps.evaluate(batches, prefix=prefix)

    def apply_control(self) -> None:
        self.owner._live.apply()

    def has_deferred(self) -> bool:
        return self.owner._live.has_deferred()

    def run_deferred(self) -> None:
        self.owner._live.run_deferred()

    def step_epoch_scheduler(self, logs: dict[str, Any]) -> None:
        step_epoch_scheduler(self.owner.scheduler, self.owner.scheduler_monitor, logs)

    def take_pending_rng(self) -> dict[str, Any] | None:
        return self.owner.run_state.take_pending_rng()
