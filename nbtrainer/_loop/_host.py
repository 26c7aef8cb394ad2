"""The seam between the Trainer and what runs a fit for it: :class:`LoopHost`, the Trainer as the fit loop and the
tools around a run see it (the training step, the live control, the LR finder, the OOM advice, checkpoints and
rollback, the run store, ``nbtrainer.Health``, samples and error analysis).

It extends the event stream's :class:`~nbtrainer._events._trainer_view.TrainerView` with the run's state (where the
run is, its training metrics, its History, the running loop), the batch steps and the verbs that change a run. The
Trainer satisfies it structurally; the loop reads its settings from ``host.options`` at the moment of use, so a change
between steps (accumulation, clipping) is seen at once. What of the Trainer is private to it and the loop (the live
control's requests, the NaN/inf gate, the parameters the optimizer steps) is handed to the loop when the Trainer builds
it, never read back through the host. ``host`` is also what callbacks get as ``trainer=``.

Read as a checklist, this is what another runner (a test harness, a new front end) must provide.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nbtrainer._events._trainer_view import TrainerView

if TYPE_CHECKING:
    from nbtrainer._events._history import History
    from nbtrainer._loop._batch_steps import BatchSteps
    from nbtrainer._loop._run_state import RunState

__all__ = ["LoopHost", "scheduler_per_step"]


class LoopHost(TrainerView, Protocol):
    """The Trainer as its fit loop and the tools around a run see it (see the module docstring)."""

    @property
    def run_state(self) -> RunState: ...  # position, training metrics, History, the running loop, the LR finder's
    @property
    def batch_steps(self) -> BatchSteps: ...  # compute, first batch, autocast, evaluate, predict, training_step=
    @property
    def checkpointed_blocks(self) -> list[str]: ...
    @property
    def micro_split(self) -> int: ...  # each loader batch as this many forward / backward passes (memory_budget_gb)
    @property
    def lrs(self) -> dict[str, float]: ...  # each optimizer's current LR (Health's advice starts from it)

    def fit(self, *args: Any, **kwargs: Any) -> History: ...
    def fit_more(self, *args: Any, **kwargs: Any) -> History: ...
    def lr_find(self, *args: Any, **kwargs: Any) -> Any: ...
    def total_steps(self, train_loader: Any, epochs: int, *, batch_size: int | None = ...) -> int: ...
    def set_lr(self, lr: float, optimizer: str | None = ..., *, source: str | None = ...) -> None: ...
    def set_max_grad_norm(self, max_grad_norm: float | None) -> None: ...
    def set_scheduler(self, scheduler: Any, interval: str = ...) -> None: ...
    def rollback(self, path: str = ...) -> str: ...  # Health.apply_advice's way back to the last checkpoint
    def state_dict(self) -> dict[str, Any]: ...


def scheduler_per_step(host: TrainerView) -> bool:
    """The scheduler steps after each optimizer step: ``scheduler_interval="step"``, and not ``ReduceLROnPlateau``
    (which steps per epoch on a logged value)."""
    import torch

    plateau = isinstance(host.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return host.scheduler is not None and host.options.step.scheduler_interval == "step" and not plateau
