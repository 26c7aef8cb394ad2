"""What every part of the Trainer shares: the attributes ``Trainer.__init__`` sets, declared once with their types.

:class:`~nbtrainer.Trainer`'s public verbs are grouped in mixins (``_fit``, ``_checkpoints``, ``_eval``,
``_control``); each inherits :class:`TrainerBase`, so a type checker knows the Trainer's state in every one of them.
That state is the configuration (model, optimizer, precision, placement...) and a few owned parts, each an object
with its own state and one owner: the run's progress across fits (``_run``: ``nbtrainer._loop._run_state.RunState``),
the batch steps and evaluation (``_steps``: ``_batch_steps.BatchSteps``), the live control (``_live``:
``_live_control.LiveControl``) and the model's setup (``_setup``). The attributes are *declared* here (annotations
only, nothing is created); ``Trainer.__init__`` sets them. The read-only views others use (``run_state``,
``batch_steps``, ``model_setup``, ``lr``, ``global_step``...) are defined here too, next to what they read.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nbtrainer._loop._control import reference_lr
from nbtrainer._trainer import _validate

if TYPE_CHECKING:
    from nbtrainer._data._batch import BatchSpec
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._options import TrainerOptions
    from nbtrainer._setup._model_setup import ModelSetup
    from nbtrainer._trainer._batch_steps import BatchSteps
    from nbtrainer._trainer._live_control import LiveControl
    from nbtrainer._trainer._memory_budget import MemoryBudget
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["TrainerBase"]


class TrainerBase:
    """The state of a :class:`~nbtrainer.Trainer`, shared by its mixins (set by ``Trainer.__init__``)."""

    # Trainers inside fit() in this process (weak: a trainer that is dropped leaves it).
    _active: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()

    # -- configuration (checked by __init__; the setters of _control change some between fits) --
    model: torch.nn.Module
    criterion: Callable[..., Any] | None
    optimizer: torch.optim.Optimizer | None
    scheduler: Any  # any LR scheduler (torch has no common base for ReduceLROnPlateau and the others)
    scheduler_interval: str
    scheduler_monitor: str | None
    precision: str
    device: torch.device
    strategy: Any  # placement (_dist): SingleDevice, DDP or FSDP (duck-typed: only the distributed ones gather)
    scaler: torch.amp.GradScaler | None
    grad_accum_steps: int
    micro_split: int  # each loader batch as this many forward / backward passes (memory_budget_gb's plan)
    options: TrainerOptions
    _budget: MemoryBudget | None  # memory_budget_gb= (nbtrainer._trainer._memory_budget)
    max_grad_norm: float | None
    optimizer_in_backward: bool  # each parameter updated inside backward (nbtrainer._loop._in_backward)
    seed: int | None
    deterministic: bool
    batch_spec: BatchSpec
    refresh_interval: float
    timing_every: int
    val_every_n_epochs: int
    non_blocking: bool
    fast_fetch: bool
    data_on_device: float
    _setup: ModelSetup
    _steps: BatchSteps  # how a batch becomes a loss / outputs, and evaluation (the overrides, validation metrics)
    _metric_spec: dict[str, Any]
    _params: list[torch.Tensor]

    # -- the run ----------------------------------------------------------------------------------
    callbacks: CallbackList
    progress: Progress
    status: str
    _run: RunState  # the run's progress across fits (loop position, metrics' state, History, the running loop)
    _live: LiveControl  # requests from any thread, applied at a step boundary; calls deferred past an event
    _nonfinite: NonFiniteGuard

    # -- read-only views of that state ------------------------------------------------------------
    @property
    def run_state(self) -> RunState:
        """The run's progress from one ``fit`` to the next (:class:`~nbtrainer._loop._run_state.RunState`): where
        the loop is (``loop_state``), the training metrics' running state, the seconds trained, the History being
        fed and, while a fit runs, its loop. What a checkpoint saves and a resume or ``fit_more`` continues.

        Example:
            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(3, 1), torch.nn.MSELoss(), "sgd", progress=False)
            >>> _ = trainer.fit([(torch.randn(4, 3), torch.randn(4, 1))] * 2, epochs=1)
            >>> trainer.run_state.loop_state.global_step, trainer.run_state.fitting
            (2, False)
        """
        return self._run

    @property
    def batch_steps(self) -> BatchSteps:
        """How this trainer turns a batch into a loss or outputs, and evaluates
        (:class:`~nbtrainer._trainer._batch_steps.BatchSteps`): the ``compute_loss=`` / ``predict_step=`` functions,
        the autocast and inference contexts, the validation metrics."""
        return self._steps

    @property
    def model_setup(self) -> ModelSetup:
        """What was done to the model before the first step (:class:`~nbtrainer._setup._model_setup.ModelSetup`):
        freezing, quantize / LoRA / offload (its ``savers``, which also decide what of the model a checkpoint
        holds), activation checkpointing, ``channels_last``, compile; ``describe()`` says it in one line."""
        return self._setup

    @property
    def history(self) -> History:
        """The History of the current (or last) fit: the object ``fit`` returns."""
        return self._run.history

    @history.setter
    def history(self, history: History) -> None:
        self._run.history = history

    @property
    def global_step(self) -> int:
        return self._run.loop_state.global_step

    @property
    def current_epoch(self) -> int:
        """1-based number of the epoch running (or last run)."""
        return self._run.loop_state.epoch + 1

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def has_validation(self) -> bool:
        return self._run.has_validation

    @property
    def lr(self) -> float:
        """The reference learning rate: OneCycle's ``max_lr``, else the base (initial) LR of group 0."""
        if self.optimizer is None:
            raise _validate.no_optimizer("lr")
        return reference_lr(self.optimizer)

    @property
    def lrs(self) -> dict[str, float]:
        """With several named optimizers (``optimizer={"name": opt}``): each one's reference LR; else empty."""
        children = getattr(self.optimizer, "optimizers", None) or {}
        return {name: reference_lr(opt) for name, opt in children.items()}

    @property
    def current_lr(self) -> float:
        if self.optimizer is None:
            raise _validate.no_optimizer("current_lr")
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def _whole(self) -> Trainer:
        """This object as the whole :class:`~nbtrainer.Trainer` (every mixin is a part of one), for the functions
        of other modules that take the trainer (typed against it, so a mixin passes ``self._whole``)."""
        return self  # type: ignore[return-value]
