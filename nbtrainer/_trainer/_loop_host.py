"""The Trainer as the fit loop sees it: :class:`TrainerHost` implements ``nbtrainer._loop._host.LoopHost``.

The loop is typed against the Protocol and never touches the Trainer's private state; this adapter is the one
place that maps the Protocol onto the Trainer: its objects and settings, and three of its parts the loop calls
directly (the run's state, the live control, the batch steps). A property reads the Trainer at the moment of use, so
a change between steps (accumulation, clipping, a resumed state) is seen at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._loop._control import step_epoch_scheduler

if TYPE_CHECKING:
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._trainer._batch_steps import BatchSteps
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
    def nonfinite(self) -> NonFiniteGuard:
        return self.owner._nonfinite

    @property
    def params(self) -> list[torch.Tensor]:
        return self.owner._params

    # -- settings -----------------------------------------------------------------------------------
    @property
    def scheduler_per_step(self) -> bool:
        return self.owner._scheduler_per_step

    @property
    def settings(self) -> Trainer:
        return self.owner  # its own public attributes are the LoopSettings

    # -- the Trainer's parts, which the loop calls directly ----------------------------------------------
    @property
    def run(self) -> RunState:
        return self.owner.run_state

    @property
    def live(self) -> LiveControl:
        return self.owner._live

    @property
    def steps(self) -> BatchSteps:
        return self.owner.batch_steps

    # -- what the loop asks of the Trainer --------------------------------------------------------------
    def step_epoch_scheduler(self, logs: dict[str, Any]) -> None:
        step_epoch_scheduler(self.owner.scheduler, self.owner.scheduler_monitor, logs)
